"""evals.prompts.chat: lm-eval's chat turns (checked against lm-eval's own helpers), the model's template, a
one-line error for a model without one, and the hf engine running gsm8k_cot_llama in chat mode with
SmolLM2-135M-Instruct's real weights (tokenised as lm-eval's HFLM tokenises chat-templated text)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from lm_eval.api.utils import Message as LmMessage
from lm_eval.api.utils import multiturn_to_singleturn
from lm_eval.models.huggingface import HFLM

from evals.errors import EvalError
from evals.prompts.chat import ChatStyle, ChatTurn, chat_template, chat_turns, single_turn
from evals.records.samples import read_records, sha256_text
from evals.run.runner import run_task
from evals.tasks import get_task
from evals.tasks.base import TaskOptions
from tests.evals.hf_fixtures import save_tiny, smollm2_or_skip
from tests.shared_data import shared_data_dir

torch.set_num_threads(1)
MODEL = "smollm2-135m"


def test_single_turn_joins_turns_as_lm_eval() -> None:
    turns = [ChatTurn("system", "sys"), ChatTurn("user", "q1", " "), ChatTurn("assistant", "a1", "\n\n"),
             ChatTurn("user", "q2", " "), ChatTurn("assistant", "Answer:")]
    theirs = multiturn_to_singleturn([LmMessage(t.role, t.content, t.delimiter) for t in turns])
    assert [(t.role, t.content) for t in single_turn(turns)] == [(m["role"], m["content"]) for m in theirs]
    no_prefill = turns[:-1]
    theirs = multiturn_to_singleturn([LmMessage(t.role, t.content, t.delimiter) for t in no_prefill])
    assert [(t.role, t.content) for t in single_turn(no_prefill)] == [(m["role"], m["content"]) for m in theirs]


def test_chat_turns_system_description_and_gen_prefix() -> None:
    style = ChatStyle(system_prompt="Be brief.", fewshot_as_multiturn=True)
    turns = chat_turns("Subject: math.\n\n", [("1+1?", "2")], "2+2?", style, gen_prefix="Answer:")
    assert [(t.role, t.content) for t in turns] == [
        ("system", "Be brief.\n\nSubject: math.\n\n"), ("user", "1+1?"), ("assistant", "2"), ("user", "2+2?"),
        ("assistant", "Answer:")]
    single = chat_turns("", [("1+1?", "2")], "2+2?", ChatStyle())
    assert [(t.role, t.content) for t in single] == [("user", "1+1? 2\n\n2+2?")]


def test_gen_prefix_continues_the_final_message() -> None:
    smollm2_or_skip()
    template = chat_template(MODEL)
    from evals.engines.base import Message

    text = template.render([Message("user", "2+2?"), Message("assistant", "Answer:")], gen_prefix=True)
    assert text.endswith("<|im_start|>assistant\nAnswer:")


def test_model_without_chat_template_is_one_line_error(tmp_path: Path) -> None:
    folder = save_tiny(tmp_path / "tiny")
    with pytest.raises(EvalError, match="has no chat template") as info:
        get_task("gsm8k_cot_llama", TaskOptions(chat=True), str(folder))
    assert "\n" not in str(info.value)
    get_task("gsm8k_cot_llama", TaskOptions(), str(folder))  # plain prompts need no template


def test_chat_without_a_model_is_refused() -> None:
    with pytest.raises(EvalError, match="needs the model"):
        get_task("arc_easy", TaskOptions(chat=True))


@pytest.fixture(scope="module")
def smollm2_engine():  # -> HFEngine with SmolLM2-135M-Instruct
    from evals.engines import build_engine

    engine = build_engine("hf", smollm2_or_skip(), {"dtype": "float32", "batch_size": 4})
    yield engine
    engine.close()


def test_hf_engine_tokenises_chat_prompts_as_hflm(smollm2_engine) -> None:
    """HFLM.tok_encode on the rendered prompt (a leading BOS-text: no special tokens added) gives our ids."""
    data_dir = shared_data_dir("gsm8k")
    task = get_task("gsm8k_cot_llama", TaskOptions(chat=True, fewshot_as_multiturn=True), MODEL)
    req = task.request(task.items(data_dir)[0], repeat=0, seed=0)
    tok = smollm2_engine.hf.tokens.tokenizer
    hflm = types.SimpleNamespace(tokenizer=tok, add_bos_token=None, prefix_token_id=tok.bos_token_id)
    assert smollm2_engine.hf.tokens.encode(req.prompt) == HFLM.tok_encode(hflm, req.prompt)


def test_hf_engine_runs_gsm8k_cot_llama_in_chat_mode(smollm2_engine, tmp_path: Path) -> None:
    data_dir = shared_data_dir("gsm8k")
    opts = TaskOptions(chat=True, fewshot_as_multiturn=True, max_tokens=24)
    task = get_task("gsm8k_cot_llama", opts, MODEL)
    out = tmp_path / "gsm8k_cot_llama.jsonl"
    summary = run_task(smollm2_engine, task, arm="baseline", out_path=out, limit=3, data_dir=data_dir,
                       progress=False)
    assert summary.written == 3 and summary.errors == 0
    records = read_records(out)
    by_id = {i.item_id: i for i in task.items(data_dir)}
    for rec in records:
        req = task.request(by_id[rec.item_id], repeat=0, seed=0)
        assert rec.prompt_hash == sha256_text(req.prompt)  # the rendered chat prompt's hash
        assert rec.completion and 0 < (rec.output_tokens or 0) <= 24
        assert set(rec.extracted) == {"strict-match", "flexible-extract"}
        assert set(rec.scores) == {"exact_match,strict-match", "exact_match,flexible-extract"}
        assert rec.finish_reason in ("stop", "length")
        assert rec.truncated is not None  # a generation: the runner decided whether it ran out of budget
        if rec.finish_reason == "length" and set(rec.extracted.values()) == {"[invalid]"}:
            assert rec.truncated  # out of budget before any filter found an answer
