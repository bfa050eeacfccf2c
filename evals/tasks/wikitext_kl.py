"""`wikitext_kl`: teacher-forced next-token distributions on WikiText-2 test text (distribution probe).

Accuracy can stay level while the model's distribution moves; this probe records, per arm and per
text chunk, the top-k next-token log-probs at every position and the log-prob of the actual next
token (Merity et al. 2016, "Pointer Sentinel Mixture Models", arXiv:1609.07843, for the text).
The comparison (KL over the top-k with the tail mass, top-1 agreement, delta-p of the actual
token, log-perplexity ratio, SEs clustered by article) is computed from two arms' records by
qa.compare.distribution; each arm's own scores here are its mean NLL and top-1 accuracy per chunk.

Items: the raw test text (evals.data "wikitext2", hub-style rows) split into articles at their
" = Title = " headings; each article's non-blank lines are packed greedily, whole lines only, into
chunks of at most `chunk_chars` characters (a longer line is a chunk of its own), then
detokenized with lm-eval's wikitext_detokenizer. Chunks are defined in characters, so items do not
depend on the tokenizer; the engine caps each chunk at `max_tokens` tokens. Item id
"<article>.<chunk>" (zero-padded), cluster "article-<article>".
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals import data
from evals.engines.base import TokenLogprobs, TokenLogprobsRequest
from evals.errors import EvalError
from evals.tasks.base import Item, Request, Result, Scored, TaskKind, TaskOptions
from evals.tasks.common import check_options, int_option, probe_extra

ARTICLE_RE = re.compile(r"^ = [^=].* = \n$")  # a top-level heading line: " = Robert Boulter = "
DEFAULT_CHUNK_CHARS = 2000  # about 450 SmolLM2 tokens of detokenized WikiText: fits max_tokens
DEFAULT_TOP_K = 20
DEFAULT_MAX_TOKENS = 512
OPTION_KEYS = ("chunk_chars", "top_k", "max_tokens")


def split_articles(rows: list[Mapping[str, Any]]) -> list[list[str]]:
    """Non-blank lines of each article, in order (text before the first heading is dropped)."""
    articles: list[list[str]] = []
    for row in rows:
        line = row["text"]
        if not line:
            continue
        if ARTICLE_RE.match(line):
            articles.append([])
        if articles:
            articles[-1].append(line)
    return articles


def pack_lines(lines: list[str], chunk_chars: int) -> list[str]:
    """Greedy packing of whole lines into chunks of at most `chunk_chars` characters."""
    chunks: list[str] = []
    current = ""
    for line in lines:
        if current and len(current) + len(line) > chunk_chars:
            chunks.append(current)
            current = ""
        current += line
    if current:
        chunks.append(current)
    return chunks


@functools.cache
def lm_eval_detokenizer() -> Callable[[dict[str, str]], str]:
    """lm-eval's `wikitext_detokenizer`, executed from its own file (lm_eval/tasks/wikitext/preprocess_wikitext.py,
    which imports only `re`): importing it by module name would first run lm_eval.tasks' package init, which
    builds lm-eval's whole task registry (about 1.6 s in every process that reads WikiText-2)."""
    package = importlib.util.find_spec("lm_eval")  # finds the package without importing it
    if package is None or package.origin is None:
        raise EvalError("wikitext_kl: lm-eval is not installed (its wikitext_detokenizer makes the chunks)")
    path = Path(package.origin).parent / "tasks" / "wikitext" / "preprocess_wikitext.py"
    spec = importlib.util.spec_from_file_location("lm_eval_wikitext_preprocess", path)
    if spec is None or spec.loader is None:
        raise EvalError(f"wikitext_kl: cannot read lm-eval's {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.wikitext_detokenizer  # type: ignore[no-any-return]


def _detokenize(text: str) -> str:
    return lm_eval_detokenizer()({"page": text})


def chunk_scores(tl: TokenLogprobs) -> dict[str, float | None]:
    """Per-arm scores of one chunk: mean NLL of the actual next token (nats) and top-1 accuracy."""
    n = len(tl.target_ids)
    if n == 0:
        return {"nll,none": None, "top1_acc,none": None}
    nll = -sum(tl.target_logprobs) / n
    top1 = sum(1 for ids, t in zip(tl.topk_ids, tl.target_ids, strict=True) if ids and ids[0] == t) / n
    return {"nll,none": nll, "top1_acc,none": top1}


@dataclass(frozen=True)
class WikitextKLTask:
    """WikiText-2 test chunks, teacher-forced; records carry top-k log-probs per position."""

    chunk_chars: int = DEFAULT_CHUNK_CHARS
    top_k: int = DEFAULT_TOP_K
    max_tokens: int = DEFAULT_MAX_TOKENS
    name: str = "wikitext_kl"
    version: str = "1"
    kind: TaskKind = "token_logprobs"

    def items(self, data_dir: Path | None) -> list[Item]:
        """Every chunk of every test article, in text order."""
        articles = split_articles(data.load("wikitext2", data_dir))
        if not articles:
            raise EvalError("wikitext2: no article headings found in the test text")
        items = []
        for a, lines in enumerate(articles):
            for c, chunk in enumerate(pack_lines(lines, self.chunk_chars)):
                items.append(Item(item_id=f"{a:03d}.{c:03d}", doc={"text": _detokenize(chunk)},
                                  cluster=f"article-{a:03d}"))
        return items

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """One teacher-forced pass over the chunk (deterministic: repeat and seed are unused)."""
        return TokenLogprobsRequest(text=item.doc["text"], top_k=self.top_k, max_tokens=self.max_tokens)

    def prompt_text(self, request: Request) -> str:
        """The chunk text."""
        assert isinstance(request, TokenLogprobsRequest)
        return request.text

    def score(self, item: Item, result: Result) -> Scored:
        """Mean NLL and top-1 accuracy of this arm on the chunk (the KL needs both arms: qa.compare.distribution)."""
        assert isinstance(result, TokenLogprobs)
        return Scored(scores=chunk_scores(result))


CHATS = False  # teacher-forced text: no prompt, so no chat template (build refuses chat = true)


def build(name: str, options: TaskOptions, template: object = None) -> WikitextKLTask:
    """The probe with its options: chunk_chars, top_k, max_tokens (in `options.extra`)."""
    extra = probe_extra("wikitext_kl", options, OPTION_KEYS, "teacher-forced text")
    check_options(name, options, generates=False, extra=True, reads=("max_tokens",),
                  chats="teacher-forced WikiText-2 text has no prompt to put in a chat template")
    max_tokens = options.max_tokens or int_option("wikitext_kl", extra, "max_tokens", DEFAULT_MAX_TOKENS, 2)
    return WikitextKLTask(
        chunk_chars=int_option("wikitext_kl", extra, "chunk_chars", DEFAULT_CHUNK_CHARS, 100),
        top_k=int_option("wikitext_kl", extra, "top_k", DEFAULT_TOP_K, 1),
        max_tokens=max_tokens,
    )
