"""The gate: `rules` is the only code that decides pass / fail / inconclusive; `verdict` holds the
verdict.json contract; `junit` and `summary` render CI artefacts from a verdict."""
