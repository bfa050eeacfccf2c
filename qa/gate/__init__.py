"""The gate: `decide` applies every rule to a comparison (the accuracy rules of `rules`, with `reference`,
`cache_path` and `sequential`, then the KV-scale `provenance` rule); each rule that reads an interval asks
`margin.interval_status`, the one decision of an interval against a margin. `candidates` decides a run of
several candidates; `junit` and `summary` render a verdict (verdict.json's contract is qa.files.verdict)."""
