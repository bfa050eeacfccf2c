"""`python -m qa.cli`: the same as the `qa` command."""

from qa.cli.main import main

main()
