"""`qa` usage errors: one line on stderr, exit 2, a did-you-mean where it helps; never 'internal error'."""

from __future__ import annotations

import pytest

from qa.cli import main
from qa.cli.main import command_names


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    return int(exc.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize(("args", "needle"), [
    (["gate", "--bogus", "x"], "No such option: --bogus"),
    (["gate", "r", "--polcy", "x"], "--policy"),
    (["nosuchcmd"], "no such command 'nosuchcmd'"),
    (["gatee"], "did you mean 'gate'?"),
    (["kv-inspct"], "did you mean 'kv-inspect'?"),
    (["run"], "Missing argument 'spec_file'"),
    (["plan", "--margin", "abc"], "--margin"),
    (["plan", "--task", "gsm8k"], "--margin"),
    (["compare", "a"], "Missing argument 'cand'"),
    (["data", "lst"], "did you mean 'list'?"),
])
def test_usage_errors_are_one_line_exit_2(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = run_cli(args, capsys)
    assert rc == 2
    assert err.startswith("error: ") and err.count("\n") == 1
    assert needle in err
    assert "internal error" not in err and "Traceback" not in err


def test_every_command_is_registered() -> None:
    assert set(command_names()) == {"calibrate", "kv-inspect", "compare", "plan", "data", "eval", "gate", "report",
                                    "run", "invariance"}
