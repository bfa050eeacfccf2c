"""`qa` console entry point: registers every command and turns user errors into one line, exit 2."""

from __future__ import annotations

import logging
import re
import sys

import typer

from qa.cli import (
    calibrate_cmd,
    compare_cmd,
    data_cmd,
    eval_cmd,
    gate_cmd,
    invariance_cmd,
    kv_inspect_cmd,
    plan_cmd,
    report_cmd,
    run_cmd,
)
from qa.cli.app import app
from qa.errors import USER_ERRORS
from qa.logs import quiet_third_party_logs
from quant.validation import did_you_mean

COMMAND_MODULES = (calibrate_cmd, kv_inspect_cmd, compare_cmd, plan_cmd, eval_cmd, run_cmd, gate_cmd, report_cmd,
                   data_cmd, invariance_cmd)  # each registers on `app`
NO_SUCH_COMMAND = re.compile(r"No such command '([^']*)'")


def command_names() -> list[str]:
    """The names of every top-level command and command group."""
    names = [c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands]
    return [n.replace("_", "-") for n in names if n] + [g.name for g in app.registered_groups if g.name]


def usage_message(exc: typer.exceptions.TyperException) -> str:
    """A usage error's text as one line, with a did-you-mean for an unknown (sub)command."""
    line = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else "qa"
    match = NO_SUCH_COMMAND.search(line)
    if match:
        names = command_names()
        if ctx is not None and hasattr(ctx.command, "list_commands") and ctx.parent is not None:
            names = list(ctx.command.list_commands(ctx))
        line = f"no such command {match.group(1)!r}; {did_you_mean(match.group(1), names, listing='commands')}"
    return f"{where}: {line} (see `{where} --help`)"


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a user error prints `error: <one line>` on stderr and exits 2 (no traceback)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    quiet_third_party_logs()
    try:
        rc = app(args=argv, standalone_mode=False)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except typer.exceptions.TyperException as exc:  # usage errors: unknown option or command, bad value
        print(f"error: {usage_message(exc)}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        print("error: interrupted; finished samples are saved, re-run the same command to resume", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 - anything unexpected: one line, never a traceback
        print(f"error: internal error {type(exc).__name__}: {exc} (please report this)", file=sys.stderr)
        sys.exit(4)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
