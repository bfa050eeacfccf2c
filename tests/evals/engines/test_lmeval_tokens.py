"""encode_pair against lm-eval itself: its TemplateLM.loglikelihood (and _encode_pair) run on real
tokenizers, empty contexts included, must hand _loglikelihood_tokens the very same token ids."""

from __future__ import annotations

from typing import Any

import pytest

from evals.engines.lmeval_tokens import encode_pair, prefix_token_id
from evals.errors import EngineError
from tests.evals.hf_fixtures import smollm2_or_skip
from tests.tiny_models import tiny_tokenizer

PAIRS = [
    ("Question: what is 2 + 3?\nAnswer:", " 5"),
    ("Answer: ", "5"),  # trailing space moves to the continuation
    ("The quick brown fox jumps over the lazy", " dog."),
    ("Once upon a time there was a small town by the river, and the people there liked \n\n", "bread"),
    ("", "The quick brown fox"),  # empty context: the prefix token is the context
    ("", " fox"),
    ("", "<s>Once upon a time"),  # continuation starting with BOS (tiny) keeps it as context
    ("", "<|im_start|>user"),  # ... the same for SmolLM2's BOS
    ("the", ""),  # empty continuation: nothing to score
]


def lmeval_pairs(tokenizer: Any, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """What lm-eval's own TemplateLM.loglikelihood passes on for `pairs` (HFLM's tok_encode and prefix token)."""
    from lm_eval.api.instance import Instance
    from lm_eval.api.model import TemplateLM

    seen: list[tuple[list[int], list[int]]] = []

    class Capture(TemplateLM):
        @property
        def eot_token_id(self) -> int:
            return tokenizer.eos_token_id

        @property
        def prefix_token_id(self) -> int:  # HFLM.prefix_token_id: BOS, else EOS
            return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id

        def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
            extra = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
            return tokenizer.encode(string, **extra)

        def _loglikelihood_tokens(self, requests: list, **kwargs: Any) -> list[tuple[float, bool]]:
            seen.extend((list(ctx), list(cont)) for _, ctx, cont in requests)
            return [(0.0, False)] * len(requests)

        def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
            raise NotImplementedError

        def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
            raise NotImplementedError

    instances = [Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=i)
                 for i, pair in enumerate(pairs)]
    Capture().loglikelihood(instances, disable_tqdm=True)
    return seen


def _tokenizers() -> list[Any]:
    return [pytest.param("tiny", id="tiny-bpe"), pytest.param("smollm2", id="smollm2")]


@pytest.fixture(params=_tokenizers())
def tokenizer(request: pytest.FixtureRequest) -> Any:
    if request.param == "tiny":
        return tiny_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_or_skip().load_id, local_files_only=True)


def test_encode_pair_equals_lm_eval_on_a_real_tokenizer(tokenizer: Any) -> None:
    scored = [p for p in PAIRS if p != ("", "")]  # lm-eval itself raises IndexError on ("", "")
    assert [encode_pair(tokenizer, c, x) for c, x in scored] == lmeval_pairs(tokenizer, scored)


def test_empty_context_is_the_prefix_token(tokenizer: Any) -> None:
    ctx, cont = encode_pair(tokenizer, "", " fox")
    assert ctx == [prefix_token_id(tokenizer)]
    assert cont == tokenizer.encode(" fox", add_special_tokens=False)
    bos = tokenizer.bos_token
    ctx, cont = encode_pair(tokenizer, "", bos + "hi")  # already starts with the prefix token: it is the context
    assert ctx == [tokenizer.bos_token_id] and cont == tokenizer.encode("hi", add_special_tokens=False)


def test_trailing_whitespace_moves_to_the_continuation() -> None:
    tok = tiny_tokenizer()
    ctx, cont = encode_pair(tok, "Answer: ", "5")
    assert ctx == tok.encode("Answer:")
    assert ctx + cont == tok.encode("Answer: 5")


class CharTokenizer:
    """One token per character (its code point); BOS 3 unless told otherwise, EOS 4."""

    def __init__(self, bos: int | None = 3, eos: int | None = 4) -> None:
        self.bos_token_id, self.eos_token_id = bos, eos

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


def test_prefix_token_falls_back_to_eos_and_empty_pairs_score_nothing() -> None:
    assert encode_pair(CharTokenizer(), "", "xy") == ([3], [ord("x"), ord("y")])
    assert encode_pair(CharTokenizer(bos=None), "", "xy") == ([4], [ord("x"), ord("y")])
    assert encode_pair(CharTokenizer(), "", "") == ([3], [])
    assert encode_pair(CharTokenizer(), "ab", "") == ([ord("a"), ord("b")], [])
    with pytest.raises(EngineError, match="neither a BOS nor an EOS"):
        encode_pair(CharTokenizer(bos=None, eos=None), "", "x")
