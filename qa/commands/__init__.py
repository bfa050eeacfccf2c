"""CLI commands: each module registers its commands on `qa.app.app` when imported."""
