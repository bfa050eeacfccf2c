"""Winogrande's partial evaluation reaches the engine: each option is scored given its own context."""

import torch

from evals.engines.base import LoglikelihoodRequest
from tests.evals.hf_fixtures import tiny_engine


def test_each_continuation_is_scored_given_its_own_context():
    torch.manual_seed(0)
    engine = tiny_engine()
    both = engine.loglikelihood([LoglikelihoodRequest(context="the cat sat", continuations=(" on the mat", " on the mat"),
                                                      contexts=("the cat sat", "a dog ran"))])[0]
    first = engine.loglikelihood([LoglikelihoodRequest(context="the cat sat", continuations=(" on the mat",))])[0]
    second = engine.loglikelihood([LoglikelihoodRequest(context="a dog ran", continuations=(" on the mat",))])[0]
    assert both.loglikelihoods == (first.loglikelihoods[0], second.loglikelihoods[0])
    assert first.loglikelihoods[0] != second.loglikelihoods[0]
