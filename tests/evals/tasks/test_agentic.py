"""The `agentic` task: long sessions built from the local GSM8K and WikiText-2 data, turns that extend turn by
turn with the reference answers and tool results, reference calls that pass the AST checker, the scorers,
sizes, and one-line errors for options that cannot build a session."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from evals.engines.base import GenerateResult
from evals.errors import EvalError
from evals.tasks import get_task
from evals.tasks.agentic import AgenticTask, score_tool
from evals.tasks.base import TaskOptions
from evals.tasks.tool_calls import decode_calls
from tests.shared_data import shared_data_dir

SMALL = {"sessions": 2, "turns": 8, "session_tokens": 2048, "context_tokens": 768}


@pytest.fixture(scope="module")
def data() -> Path:
    return shared_data_dir("wikitext2/derived/wiki.test.raw")


def task(max_tokens: int | None = None, **extra: object) -> AgenticTask:
    built = get_task("agentic", TaskOptions(max_tokens=max_tokens, extra={**SMALL, **extra}))
    assert isinstance(built, AgenticTask)
    return built


def gen(text: str) -> GenerateResult:
    return GenerateResult(text=text, output_tokens=3, finish_reason="stop")


def test_items_are_sessions_x_turns_x_paths_and_turn_kinds_follow_the_cycle(data: Path) -> None:
    t = task(paths=["cold", "warm"], shuffles=1)
    items = t.items(data)
    assert t.path_names() == ["cold", "warm", "shuffled"] and len(items) == 2 * 8 * 3
    assert items[0].item_id == "s000/t1/cold" and items[-1].item_id == "s001/t8/shuffled"
    assert {it.cluster for it in items} == {"s000", "s001"}
    cold = [it for it in items if it.doc["path"] == "cold" and it.cluster == "s000"]
    assert [it.doc["ask"] for it in cold] == ["tool", "lookup", "tool", "gsm8k"] * 2
    tools = [it.doc["tool"]["function"] for it in cold if it.doc["ask"] == "tool"]
    assert tools[0] in ("read_document", "search_notes") and tools[1] not in ("read_document", "search_notes")
    assert task(paths=["warm"]).path_names() == ["warm"]


def test_each_turn_extends_the_previous_with_its_reference_answer_and_tool_result(data: Path) -> None:
    t = task()
    cold = [it for it in t.items(data) if it.doc["path"] == "cold" and it.cluster == "s001"]
    context = t.session_context(cold[0])
    assert "Functions:\n" in context and "Reference facts:\n" in context and context.endswith("Conversation:\n\n")
    for prev, cur in pairwise(cold):
        head = prev.doc["prompt"] + t.reference(prev)
        assert cur.doc["prompt"].startswith(head)
        rest = cur.doc["prompt"][len(head):]
        assert rest.startswith("\nTool: {" if prev.doc["ask"] == "tool" else "\n\nUser: ")
        assert cur.doc["prompt"].endswith("\nAssistant:") and cur.doc["prompt"].startswith(context)


def test_every_path_sends_the_same_prompt_and_the_same_seed_builds_the_same_sessions(data: Path) -> None:
    t = task(paths=["cold", "warm"])
    prompts: dict[str, set[str]] = {}
    for it in t.items(data):
        prompts.setdefault(it.item_id.rsplit("/", 1)[0], set()).add(t.prompt_text(t.request(it, repeat=0, seed=0)))
    assert all(len(p) == 1 for p in prompts.values())
    again = [it.doc["prompt"] for it in task().items(data)]
    assert again == [it.doc["prompt"] for it in t.items(data)]
    assert again != [it.doc["prompt"] for it in task(seed=1).items(data)]


def test_reference_answers_score_one_and_name_facts_of_the_context(data: Path) -> None:
    t = task()
    for it in t.items(data):
        if it.doc["path"] != "cold":
            continue
        scored = t.score(it, gen(t.reference(it)))
        assert scored.scores == {"exact_match,strict-match": 1.0, "exact_match,flexible-extract": 1.0}, it.item_id
        assert scored.meta["kind"] == it.doc["ask"] and scored.meta["prompt_chars"] == len(it.doc["prompt"])
        context = t.session_context(it)
        if it.doc["ask"] == "lookup":
            assert f"\n{it.doc['source']}: {it.doc['answer']}\n" in context
        if it.doc["ask"] == "tool":
            assert scored.meta["tool_parsed"] is True and scored.meta["tool_correct"] is True
            assert scored.meta["tool_error"] is None
            assert decode_calls(it.doc["answer"]) is not None
            assert f'"name": "{it.doc["tool"]["function"]}"' in context  # the function is documented


def test_tool_scorer_on_wrong_prose_and_unparsed_outputs(data: Path) -> None:
    it = next(i for i in task().items(data) if i.doc["ask"] == "tool")
    tool, name = it.doc["tool"], it.doc["tool"]["function"]
    wrong = score_tool(f" [{name}()]", tool)
    assert wrong.scores["exact_match,strict-match"] == 0.0 and wrong.meta["tool_parsed"] is True
    assert wrong.meta["tool_error"] == "simple_function_checker:missing_required"
    prose = score_tool(f" Sure: {it.doc['answer']} done", tool)
    assert prose.scores == {"exact_match,strict-match": 0.0, "exact_match,flexible-extract": 1.0}
    assert prose.meta["tool_parsed"] is False and prose.meta["tool_error"] == "not_parsed"
    cut = score_tool(" [send_message(recipient='12", tool)
    assert cut.extracted["strict-match"] == "[invalid]" and cut.meta["tool_error"] == "not_parsed"


def test_lookup_and_gsm8k_turns_keep_the_sessions_scorers(data: Path) -> None:
    t = task()
    items = [it for it in t.items(data) if it.doc["path"] == "cold"]
    look = next(it for it in items if it.doc["ask"] == "lookup")
    assert t.score(look, gen(f" 12 then {look.doc['answer']}")).scores == {
        "exact_match,strict-match": 0.0, "exact_match,flexible-extract": 1.0}
    math = next(it for it in items if it.doc["ask"] == "gsm8k")
    final = math.doc["answer"].rsplit("#### ", 1)[1]
    assert t.score(math, gen(f" so it is {final}")).scores["exact_match,flexible-extract"] == 1.0


def test_sessions_grow_to_about_session_tokens_on_smollm2(data: Path) -> None:
    from evals.errors import ModelError
    from evals.models.resolve import resolve_model

    try:
        path = resolve_model("smollm2-135m").path
    except ModelError as exc:
        pytest.skip(f"SmolLM2 not available: {exc}")
    from transformers import AutoTokenizer  # heavy: only to count tokens

    tok = AutoTokenizer.from_pretrained(path)
    t = task(session_tokens=3072, context_tokens=1536, turns=12)
    last = [it for it in t.items(data) if it.doc["path"] == "cold" and it.doc["turn"] == 12]
    sizes = [len(tok.encode(it.doc["prompt"])) for it in last]
    assert all(0.85 * 3072 < n < 1.15 * 3072 for n in sizes), sizes
    first = [len(tok.encode(t.session_context(it))) for it in last]
    assert all(0.85 * 1536 < n < 1.15 * 1536 for n in first), first
    # a context smaller than its fixed part (instruction, 8 function docs, facts, examples) is that part
    small = task(context_tokens=512, functions=3)
    assert len(tok.encode(small.session_context(small.items(data)[0]))) < 800


def test_generation_budgets_per_kind_and_the_max_tokens_override(data: Path) -> None:
    t = task()
    by_kind = {it.doc["ask"]: t.request(it, repeat=0, seed=0) for it in t.items(data)}
    assert (by_kind["tool"].max_tokens, by_kind["lookup"].max_tokens, by_kind["gsm8k"].max_tokens) == (96, 16, 256)
    assert "\n" in by_kind["tool"].until and "\n" not in by_kind["gsm8k"].until and "User:" in by_kind["gsm8k"].until
    assert t.max_new_tokens == 256 and task(cycle=["tool", "lookup"]).max_new_tokens == 96
    assert task(max_tokens=8).max_new_tokens == 8


@pytest.mark.parametrize(("extra", "match"), [
    ({"bogus": 1}, r"unknown option\(s\) \['bogus'\]"),
    ({"cycle": ["tool", "chat"]}, r"option cycle must be a non-empty list of tool, lookup, gsm8k.*\(chat unknown\)"),
    ({"cycle": []}, "option cycle must be a non-empty list"),
    ({"paths": ["cold", "shuffled"]}, r"option paths must be a non-empty list of cold, warm"),
    ({"paths": ["cold", "cold"]}, "lists a path twice"),
    ({"functions": 13}, "at most 12"),
    ({"functions": 2}, "option functions must be an integer >= 3"),
    ({"session_tokens": 768}, "option session_tokens must be an integer >= 769"),
    ({"context_tokens": 100}, "option context_tokens must be an integer >= 512"),
    ({"turns": 0}, "option turns must be an integer >= 1"),
    ({"shuffle_batch": 1}, "option shuffle_batch must be an integer >= 2"),
])
def test_bad_options_are_one_line_errors(extra: dict[str, object], match: str) -> None:
    with pytest.raises(EvalError, match=match) as err:
        task(**extra)
    assert "\n" not in str(err.value)


def test_chat_and_fewshot_are_refused() -> None:
    with pytest.raises(EvalError, match="chat = true is not supported"):
        get_task("agentic", TaskOptions(chat=True), model="smollm2-135m")
    with pytest.raises(EvalError, match="num_fewshot does not apply"):
        get_task("agentic", TaskOptions(num_fewshot=2))


def test_too_few_gsm8k_problems_is_one_line(data: Path) -> None:
    with pytest.raises(EvalError, match="GSM8K turns need") as err:
        task(sessions=400, turns=32).build_sessions(data)
    assert "\n" not in str(err.value)
