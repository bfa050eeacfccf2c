"""The fixed-batch path (models whose caches have no row operations, and the one-by-one fallback):
left-padded prompts, finished rows leave the batch, same results as continuous batching."""

from __future__ import annotations

from evals.engines.base import GenerateRequest, GenerateResult
from evals.engines.hf.fixed_batch import generate_batch
from tests.evals.hf_fixtures import PROMPTS, reference_greedy, tiny_engine


def test_left_padded_batch_equals_model_generate_per_prompt() -> None:
    engine = tiny_engine({"prefill_chunk": 16})
    reqs = [GenerateRequest(prompt=" ".join([p] * (1 + i)), max_tokens=3 + 2 * i) for i, p in enumerate(PROMPTS)]
    prompts = [engine.hf.tokens.encode(r.prompt) for r in reqs]
    results = generate_batch(engine.hf, reqs, prompts, None)
    for req, res in zip(reqs, results, strict=True):
        ids, text = reference_greedy(engine, req.prompt, req.max_tokens)
        assert res == GenerateResult(text=text, output_tokens=len(ids), finish_reason="length")


def test_fixed_batches_give_the_continuous_batching_results() -> None:
    prefix = "Question: what is 2 + 3? Answer: 5.\n\n"
    reqs = [GenerateRequest(prompt=prefix + p, max_tokens=4 + i, prefix=prefix, until=("dog",) if i == 1 else ())
            for i, p in enumerate(PROMPTS)]
    reqs.append(GenerateRequest(prompt=PROMPTS[1], max_tokens=6, temperature=1.0, seed=3))
    stream = tiny_engine({"batch_size": 2})
    fixed = tiny_engine({"batch_size": 2})
    fixed.hf.rows_ok = False  # as for a model with sliding-window layers
    assert fixed.generate(reqs) == stream.generate(reqs)
