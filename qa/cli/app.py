"""The Typer application object; the command modules of `qa.cli` register on it."""

import typer

app = typer.Typer(
    name="qa",
    help="Is the optimized deployment as accurate as its baseline? Paired evals, statistical gates, reports.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
