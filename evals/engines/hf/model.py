"""HFModel: a loaded transformers causal LM with its tokenizer and engine arguments, and the three
things every request kind does with it: take a fresh KV cache, run a forward pass that extends it,
and read logits at chosen positions only.

`new_cache` is the one place where the cache class is chosen: the quantized cache when the arm has a
`kv` spec, the plain growable one (`quant.kv.plain`) when it has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from evals.engines.hf.args import HFEngineArgs
from evals.engines.hf.fit import context_window
from evals.engines.hf.surgery import cache_keyword, split_head
from evals.engines.hf.tokens import HFTokens
from quant.errors import QuantError
from quant.kv.cache import make_cache
from quant.kv.plain import make_plain_cache
from quant.scales.files import KVScales

Span = tuple[int, int, int]  # (batch row, first position, number of positions)


class HFModel:
    """The model, its tokenizer rules and arguments, and what its caches support."""

    def __init__(self, model: Any, tokenizer: Any, args: HFEngineArgs, scales: KVScales | None = None) -> None:
        self.model = model
        self.tokens = HFTokens(tokenizer, model.generation_config, args.add_bos_token)
        self.args = args
        self.scales = scales
        self.device = torch.device(args.device)
        self.max_length: int = args.max_length or context_window(model.config, tokenizer)
        self.vocab_size = int(model.config.vocab_size)
        self.cache_kw = cache_keyword(model)
        self.decoder, self.head = split_head(model)
        self.split_head = self.decoder is not None  # False: logits come from full forwards
        self.decoder_cache_kw = cache_keyword(self.decoder) if self.decoder is not None else self.cache_kw
        try:  # continuous batching needs a cache with row operations (full-attention layers only)
            self.rows_ok = bool(getattr(self.new_cache(), "supports_rows", False))
        except Exception:  # noqa: BLE001 - a spec that does not fit the model is reported by build()
            self.rows_ok = False
        # draft tokens leave rejected positions in the cache, masked out: harmless unless a recent
        # window counts positions (it would then hold fewer real tokens than without drafts)
        self.drafts_ok = (self.rows_ok and args.draft_tokens > 0
                          and (args.kv is None or args.kv.recent_window == 0))

    def new_cache(self, padding_mask: torch.Tensor | None = None) -> Any:
        """A fresh, empty KV cache for one forward batch: quantized when the arm has a kv spec, else the
        plain growable cache (`quant.kv.plain`; transformers' DynamicCache for models it cannot describe).

        `padding_mask` ([batch, first-write tokens], 1 = real token) keeps pads out of dynamic scales."""
        if self.args.kv is None:
            try:
                return make_plain_cache(self.model.config)
            except QuantError:  # a model our caches do not describe (e.g. encoder-decoder): transformers' own
                from transformers import DynamicCache  # transformers: only for such a model

                return DynamicCache(config=self.model.config)
        cache = make_cache(self.model.config, self.args.kv, self.scales)
        if padding_mask is not None:
            cache.set_padding_mask(padding_mask)
        return cache

    def forward(self, input_ids: torch.Tensor, *, cache: Any, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, logits_to_keep: int = 0) -> torch.Tensor:
        """Logits [batch, kept positions, vocab] of one forward pass that extends `cache`."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=logits_to_keep, **{self.cache_kw: cache})
        return out.logits

    def span_logits(self, input_ids: torch.Tensor, spans: Sequence[Span], *, cache: Any,
                    attention_mask: torch.Tensor | None = None,
                    position_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Logits [length, vocab] at positions start..start+length-1 of each (row, start, length) span.

        When the model's logits are its output layer applied to the decoder's last hidden state
        (Llama, Qwen, Gemma with its soft cap, ...), only the spans' rows go through the output
        layer: for a 49k vocabulary that layer costs as much as the rest of a small model."""
        if self.split_head:
            out = self.decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=True, **{self.decoder_cache_kw: cache})
            hidden = out.last_hidden_state  # [n, s, hidden]
            picked = torch.cat([hidden[r, a : a + n] for r, a, n in spans])  # [sum of lengths, hidden]
            logits = self.head(picked)
            cap = getattr(self.model.config, "final_logit_softcapping", None)
            if cap:
                logits = torch.tanh(logits / cap) * cap
            return list(torch.split(logits, [n for _, _, n in spans]))
        s = input_ids.shape[1]
        keep = s - min(a for _, a, _ in spans)
        logits = self.forward(input_ids, cache=cache, attention_mask=attention_mask, position_ids=position_ids,
                              logits_to_keep=keep)  # [n, keep, vocab]
        return [logits[r, a - (s - keep) : a - (s - keep) + n] for r, a, n in spans]
