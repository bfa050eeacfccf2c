"""The `qa` command line: a thin shell over `qa.api` (each command parses, calls one function,
prints, exits). `main` is the console entry point."""

from qa.cli.main import main

__all__ = ["main"]
