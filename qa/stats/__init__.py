"""Paired statistics: numbers only (estimates, SEs, intervals, tests, power formulas); no decisions.

Conventions (docs/STATISTICS.md): d_i = b_i - a_i = candidate - baseline per item, repeats averaged
per item and arm first; ddof = 1; t reference with n - 1 df, or G - 1 with CR1 cluster-robust SEs
when items share a cluster key; Tango's score interval for binary, single-repeat, unclustered data
with few discordant pairs; every random draw from `numpy.random.default_rng(seed)`.

Modules: `basic` (SEs, the one t interval, Wilson intervals, flips), `paired_tests` (McNemar / item
sign test, Tango), `intervals` (the one function giving the CI of delta at any level), `power` (MDE,
items and repeats needed), `bootstrap` (paired BCa), `multiplicity` (Holm), `sequential`
(group-sequential boundaries). qa.compare builds the estimates from them.
Pass / fail / inconclusive is decided only in qa.gate (an interval against a margin: qa.gate.margin).
"""
