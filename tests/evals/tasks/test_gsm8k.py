"""GSM8K: options reach the request, the few-shot block is the item's typed field, and lm-eval's
two answer filters and exact-match normalisation."""

from __future__ import annotations

import pytest

from evals.engines.base import GenerateRequest, GenerateResult
from evals.tasks import get_task, gsm8k
from evals.tasks.base import Item, TaskOptions
from evals.tasks.exact_match import exact_match
from tests.shared_data import SHARED_DATA as DATA_DIR

GSM_TARGET = "Janet sells 16 - 3 - 4 = 9 duck eggs a day.\nShe makes 9 * 2 = $18 every day.\n#### 18"


def gen(text: str) -> GenerateResult:
    return GenerateResult(text=text, output_tokens=len(text.split()), finish_reason="stop")


def test_generation_options_reach_the_request() -> None:
    task = get_task("gsm8k", TaskOptions(num_fewshot=0, max_tokens=64, temperature=0.7))
    item = Item("0", {"question": "q", "answer": "a #### 1"})
    req = task.request(item, repeat=1, seed=99)
    assert (req.max_tokens, req.temperature, req.seed, req.prompt) == (64, 0.7, 99, "Question: q\nAnswer:")
    greedy = get_task("gsm8k", TaskOptions(num_fewshot=0)).request(item, repeat=0, seed=99)
    assert greedy.seed is None and greedy.max_tokens == 256


def test_the_items_fewshot_block_precedes_the_question() -> None:
    task = get_task("gsm8k", TaskOptions(num_fewshot=1))
    item = Item("0", {"question": "q", "answer": "a #### 1"}, fewshot="Question: s\nAnswer: t #### 2\n\n")
    req = task.request(item, repeat=0, seed=0)
    assert isinstance(req, GenerateRequest)
    assert req.prompt == "Question: s\nAnswer: t #### 2\n\nQuestion: q\nAnswer:" and req.prefix is None


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data")
def test_items_carry_their_own_fewshot_block_outside_the_document() -> None:
    items = get_task("gsm8k", TaskOptions(num_fewshot=2)).items(DATA_DIR)[:3]
    assert all(set(it.doc) == {"id", "question", "answer"} for it in items)  # the row as loaded, untouched
    assert all(it.fewshot.count("Question: ") == 2 and it.fewshot.endswith("\n\n") for it in items)
    assert len({it.fewshot for it in items}) == 3  # lm-eval's sampler draws new shots per document
    zero = get_task("gsm8k", TaskOptions(num_fewshot=0)).items(DATA_DIR)[0]
    assert zero.fewshot == ""


@pytest.mark.parametrize(
    ("completion", "strict", "flexible", "strict_em", "flexible_em"),
    [
        (" She sells 9 eggs for $2 each.\n#### 18", "18", "18", 1.0, 1.0),
        (" 9 * 2 = 18 dollars. #### 18.", "18.", "18.", 1.0, 1.0),  # trailing "." is ignored
        (" She makes $1,8 ... no: the total is $18.", "[invalid]", "$18.", 0.0, 1.0),
        (" #### 17\nQuestion", "17", "17", 0.0, 0.0),
        (" I don't know.", "[invalid]", "[invalid]", 0.0, 0.0),
        (" #### -18", "-18", "-18", 0.0, 0.0),
    ],
)
def test_filters_and_exact_match(
    completion: str, strict: str, flexible: str, strict_em: float, flexible_em: float
) -> None:
    task = get_task("gsm8k", TaskOptions(num_fewshot=0))
    item = Item("0", {"question": "q", "answer": GSM_TARGET})
    scored = task.score(item, gen(completion))
    assert scored.extracted == {"strict-match": strict, "flexible-extract": flexible}
    assert scored.scores == {
        "exact_match,strict-match": strict_em,
        "exact_match,flexible-extract": flexible_em,
    }
    assert scored.target == GSM_TARGET


def test_exact_match_normalisation() -> None:
    assert exact_match("$1,234", "blah #### 1234", gsm8k.NORMALISATION) == 1.0
    assert exact_match("1234", "blah #### 1,234", gsm8k.NORMALISATION) == 1.0
    assert exact_match("12", "blah #### 1234", gsm8k.NORMALISATION) == 0.0
