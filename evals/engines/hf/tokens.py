"""Tokenisation with lm-eval's HFLM rules (lm_eval/models/huggingface.py `tok_encode`): which special
tokens an encoding gets, the end-of-sequence and padding ids, and decoding generated tokens.

Pairs for log-likelihood are split by the one `evals.engines.lmeval_tokens.encode_pair`, given this
class as its tokenizer (so `add_bos_token` and the leading-BOS rule apply to both halves)."""

from __future__ import annotations

from typing import Any


class HFTokens:
    """A transformers tokenizer with lm-eval's encoding rules and the ids the engine needs."""

    def __init__(self, tokenizer: Any, generation_config: Any, add_bos_token: bool | None) -> None:
        self.tokenizer = tokenizer
        self.add_bos_token = add_bos_token
        gen_eos = getattr(generation_config, "eos_token_id", None)
        eos: set[int] = set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_ids = frozenset(eos)  # generation stops at any of these (the model's and the tokenizer's)
        self.pad_id: int = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.bos_text: str | None = tokenizer.decode([prefix]) if prefix is not None else None

    @property
    def bos_token_id(self) -> int | None:
        """The tokenizer's BOS id (None when it has none)."""
        return self.tokenizer.bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's EOS id (None when it has none)."""
        return self.tokenizer.eos_token_id

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """Token ids of `text` as lm-eval's HFLM.tok_encode makes them."""
        kwargs: dict[str, bool] = {}
        if add_special_tokens is not None:
            kwargs["add_special_tokens"] = add_special_tokens
        elif self.add_bos_token is not None:
            kwargs["add_special_tokens"] = self.add_bos_token
        if add_special_tokens is None and self.bos_text and text.startswith(self.bos_text):
            kwargs["add_special_tokens"] = False
        return list(self.tokenizer.encode(text, **kwargs))

    def decode(self, tokens: list[int]) -> str:
        """Text of generated token ids, special tokens left out."""
        return self.tokenizer.decode(tokens, skip_special_tokens=True)
