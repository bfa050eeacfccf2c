"""The gate: `decide` applies every rule to a comparison (the accuracy rules of `rules`, which add the
reference-answer rules of `reference`, the warm/cold cache-path rules of `cache_path` and the sequential looks of
`sequential`; then the KV-scale `provenance` rule); each rule that reads an interval asks
`margin.interval_status`, the one decision of an interval against a margin. `candidates` decides a run of
several candidates; `junit` and `summary` render a verdict (verdict.json's contract is qa.files.verdict)."""
