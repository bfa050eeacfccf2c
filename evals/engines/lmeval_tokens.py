"""How lm-eval tokenises a (context, continuation) pair for log-likelihood: the one copy every engine uses.

lm-eval 0.4 (lm_eval/api/model.py, `TemplateLM.loglikelihood` and `TemplateLM._encode_pair`):
- a non-empty context gives its trailing whitespace to the continuation, then the two are encoded
  together and split after the context's own tokens (`whole[len(encode(context)):]`), so a word
  that merges across the boundary is scored as the model would see it;
- an empty context becomes the prefix token (BOS, else EOS, as HFLM and the API models choose it)
  before the continuation encoded without special tokens; when the continuation already starts
  with that token, its first token is the context instead.
"""

from __future__ import annotations

from typing import Protocol

from evals.errors import EngineError


class PairTokenizer(Protocol):
    """What `encode_pair` needs of a tokenizer (a transformers tokenizer qualifies as it is)."""

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def prefix_token_id(tokenizer: PairTokenizer) -> int:
    """The token lm-eval puts before a continuation that has no context: BOS, else EOS."""
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if prefix is None:
        raise EngineError("the tokenizer has neither a BOS nor an EOS token: cannot score an empty context")
    return prefix


def encode_pair(tokenizer: PairTokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval's loglikelihood makes them (see the module docstring).

    An empty context with an empty continuation (lm-eval raises IndexError there) is the prefix token
    and nothing to score."""
    if context == "":
        cont = list(tokenizer.encode(continuation, add_special_tokens=False))
        prefix = prefix_token_id(tokenizer)
        if not cont or cont[0] != prefix:
            return [prefix], cont
        return cont[:1], cont[1:]
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = list(tokenizer.encode(context + continuation))
    ctx = list(tokenizer.encode(context))
    return ctx, whole[len(ctx) :]
