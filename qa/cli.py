"""`qa` console entry point: imports the command modules and turns user errors into one line, exit 2."""

from __future__ import annotations

import importlib
import logging
import sys

from qa.app import app
from qa.logs import quiet_third_party_logs

# Each module registers its commands on `app`; a module that does not exist yet is skipped.
COMMAND_MODULES = (
    "qa.commands.data",
    "qa.commands.compare",
    "qa.commands.gate",
    "qa.commands.calibrate",
    "qa.commands.evaluate",
    "qa.commands.run",
)


def _load_commands() -> None:
    for name in COMMAND_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a user error prints `error: <one line>` on stderr and exits 2 (no traceback)."""
    from qa.errors import USER_ERRORS

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    quiet_third_party_logs()
    _load_commands()
    try:
        rc = app(args=argv, standalone_mode=False)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        print("error: interrupted; finished samples are saved, re-run the same command to resume", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # click usage errors and anything unexpected: never a traceback
        import click

        if isinstance(exc, click.exceptions.ClickException):
            print(f"error: {exc.format_message()}", file=sys.stderr)
            sys.exit(2)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(130)
        print(f"error: internal error {type(exc).__name__}: {exc} (please report this)", file=sys.stderr)
        sys.exit(4)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
