"""GPQA model-card CoT on synthetic documents only (no real question text anywhere): per-(item, repeat)
seeded permutations, simple-evals' template and "Answer: X" extraction, the gold letter per repeat."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from evals.engines.base import GenerateRequest, GenerateResult
from evals.records.samples import read_records
from evals.run.runner import run_task
from evals.tasks import get_task, gpqa_modelcard
from evals.tasks.base import Item

DOC = {"id": "rec7", "Record ID": "rec7", "Question": "synthetic?", "Correct Answer": "right",
       "Incorrect Answer 1": "w1", "Incorrect Answer 2": "w2", "Incorrect Answer 3": "w3"}


def gen(text: str) -> GenerateResult:
    return GenerateResult(text=text, output_tokens=len(text.split()), finish_reason="stop")


def test_permutation_is_seeded_per_item_and_repeat() -> None:
    perms = [gpqa_modelcard.permutation("rec7", r) for r in range(8)]
    assert all(sorted(p) == [0, 1, 2, 3] for p in perms)
    assert perms == [gpqa_modelcard.permutation("rec7", r) for r in range(8)]  # deterministic
    assert len({tuple(p) for p in perms}) > 1  # repeats see other orders
    assert perms[0] == random.Random("gpqa-modelcard/rec7/0").sample(range(4), 4)


def test_prompt_is_simple_evals_template_with_shuffled_choices() -> None:
    perm = [2, 0, 3, 1]
    text = gpqa_modelcard.query(DOC, perm)
    assert text.startswith("Answer the following multiple choice question. The last line of your response")
    assert text.endswith("synthetic?\n\nA) w2\nB) right\nC) w3\nD) w1")
    assert gpqa_modelcard.gold_letter(perm) == "B"


@pytest.mark.parametrize(("answer", "strict", "flexible"), [
    ("Reasoning...\nAnswer: C", "C", "C"),
    ("answer:$b$", "B", "B"),
    ("Answer: A at first. Final answer is (D)", "A", "D"),
    ("I think the answer is B.", None, "B"),
    ("no letter here", None, None),
])
def test_extraction(answer: str, strict: str | None, flexible: str | None) -> None:
    assert gpqa_modelcard.extract(answer) == {"strict-match": strict, "flexible-extract": flexible}


def test_score_uses_the_repeats_gold_letter_and_records_the_permutation() -> None:
    task = get_task("gpqa_diamond_cot_modelcard")
    assert task.settings.temperature == 0.5 and task.settings.max_tokens == 1024
    item = Item(item_id="rec7", doc=DOC)
    for repeat in range(4):
        perm = gpqa_modelcard.permutation("rec7", repeat)
        gold = "ABCD"[perm.index(0)]
        req = task.request(item, repeat=repeat, seed=11)
        assert isinstance(req, GenerateRequest) and req.temperature == 0.5 and req.seed == 11
        scored = task.score_repeat(item, gen(f"...\nAnswer: {gold}"), repeat)
        assert scored.scores == {"exact_match,strict-match": 1.0, "exact_match,flexible-extract": 1.0}
        assert scored.target == gold and scored.meta == {"permutation": ",".join(map(str, perm))}
    with pytest.raises(TypeError, match="score_repeat"):
        task.score(item, gen("Answer: A"))


class SyntheticModelCard(gpqa_modelcard.GpqaModelCardTask):
    def items(self, data_dir: Path | None) -> list[Item]:
        return [Item(item_id=f"rec{i}", doc={**DOC, "id": f"rec{i}"}) for i in range(3)]


class GoldEngine:
    """Answers every request with the letter under which "right" is shown (read from its prompt)."""

    from evals.engines.base import EngineInfo

    info = EngineInfo(name="fake", model="fake", deterministic=True)

    def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        out = []
        for req in requests:
            line = next(ln for ln in req.prompt.splitlines() if ln.endswith(") right"))
            out.append(gen(f"Answer: {line[0]}"))
        return out

    def close(self) -> None:
        pass


def test_runner_scores_each_repeat_with_its_own_order(tmp_path: Path) -> None:
    base = get_task("gpqa_diamond_cot_modelcard")
    task = SyntheticModelCard(name=base.name, dataset=base.dataset, settings=base.settings)
    out = tmp_path / "r.jsonl"
    run_task(GoldEngine(), task, arm="baseline", out_path=out, repeats=4, progress=False)  # type: ignore[arg-type]
    records = read_records(out)
    assert len(records) == 12 and all(r.error is None for r in records)
    assert all(r.scores["exact_match,strict-match"] == 1.0 for r in records)
    for r in records:
        assert r.meta["permutation"] == ",".join(map(str, gpqa_modelcard.permutation(r.item_id, r.repeat)))
    assert len({r.target for r in records}) > 1  # the gold letter moves with the order
