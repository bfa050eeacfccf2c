"""The Typer application object; command modules under `qa/commands/` register on it."""

import typer

app = typer.Typer(
    name="qa",
    help="Is the optimized deployment as accurate as its baseline? Paired evals, statistical gates, reports.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
