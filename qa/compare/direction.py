"""Which way is better for a metric: higher for accuracy-like scores (lm-eval's `higher_is_better` for acc,
exact_match, ...; a mean log-likelihood), lower for the metrics named in LOWER_IS_BETTER. comparison.json's
items_better / items_worse, McNemar's discordant counts (n10 regressions, n01 improvements) and flips'
regressions / improvements follow it (qa.compare.estimate); delta stays candidate - baseline whatever the
direction."""

from __future__ import annotations

# metric names (the part of "metric,filter" before the comma) where a lower score is better: this toolkit's
# wikitext_kl `nll` (nats/token), the generation `truncated` indicator and a KL divergence (`kl`, `kld`);
# lm-eval's metrics registered with higher_is_better=False (lm-eval 0.4.13, lm_eval/api/metrics.py
# register_metric: brier_score, perplexity, word_perplexity, byte_perplexity, bits_per_byte, ter)
LOWER_IS_BETTER: frozenset[str] = frozenset({
    "nll", "truncated", "kl", "kld",
    "brier_score", "perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte", "ter",
})


def higher_is_better(metric: str) -> bool:
    """Whether a higher score is better for `metric` ("acc" or "acc,none"; module docstring)."""
    return metric.partition(",")[0] not in LOWER_IS_BETTER
