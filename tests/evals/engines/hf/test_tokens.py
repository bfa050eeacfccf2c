"""HFTokens: lm-eval's HFLM encoding rules, and pairs split by the one lmeval_tokens.encode_pair."""

from __future__ import annotations

import pytest

from evals.engines.hf.tokens import HFTokens
from evals.engines.lmeval_tokens import encode_pair
from tests.tiny_models import tiny_tokenizer


@pytest.fixture(scope="module")
def tokens() -> HFTokens:
    return HFTokens(tiny_tokenizer(), None, add_bos_token=None)


def test_encode_pair_moves_trailing_space_and_splits_whole_encoding(tokens: HFTokens) -> None:
    tok = tokens.tokenizer
    ctx, cont = encode_pair(tokens, "Answer: ", "5")
    assert tok.decode(cont) == " 5"
    assert ctx + cont == tok.encode("Answer: 5")
    ctx, cont = encode_pair(tokens, "", "the fox")  # empty context: BOS as context, as lm-eval
    assert ctx == [tok.bos_token_id] and cont == tok.encode("the fox")


def test_add_bos_token_and_a_leading_bos_string_decide_special_tokens() -> None:
    from transformers import PreTrainedTokenizerFast

    class WithBos(PreTrainedTokenizerFast):  # a tokenizer that adds BOS by default, as Llama's does
        def encode(self, text, add_special_tokens=True, **kw):  # type: ignore[override]
            ids = super().encode(text, add_special_tokens=False, **kw)
            return [self.bos_token_id, *ids] if add_special_tokens else ids

    base = tiny_tokenizer()
    tok = WithBos(tokenizer_object=base.backend_tokenizer, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    plain = tok.encode("the fox", add_special_tokens=False)
    assert HFTokens(tok, None, add_bos_token=None).encode("the fox") == [tok.bos_token_id, *plain]
    assert HFTokens(tok, None, add_bos_token=False).encode("the fox") == plain
    assert HFTokens(tok, None, add_bos_token=None).encode("<s>the fox") == tok.encode("<s>the fox", add_special_tokens=False)


def test_eos_and_pad_ids_come_from_the_generation_config_and_the_tokenizer() -> None:
    from transformers import GenerationConfig

    tok = tiny_tokenizer()
    both = HFTokens(tok, GenerationConfig(eos_token_id=[7, 9]), add_bos_token=None)
    assert both.eos_ids == frozenset({7, 9, tok.eos_token_id})
    assert both.pad_id == tok.pad_token_id
    assert both.decode(tok.encode("the fox") + [tok.eos_token_id]) == "the fox"
