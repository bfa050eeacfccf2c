"""The one stop-string cutter: lm-eval's `until` (lm_eval/models/utils.py, postprocess_generated_text).

lm-eval splits the text at each non-empty stop string in turn and keeps the part before it, which
leaves the text before the earliest occurrence of any of them. Servers and vLLM usually stop there
already; cutting again makes every engine return the same text for the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence


def cut_at_stop(text: str, until: Sequence[str]) -> str:
    """`text` up to (not including) the earliest occurrence of any non-empty stop string in `until`."""
    cut = len(text)
    for stop in until:
        if stop:
            i = text.find(stop)
            if i != -1:
                cut = min(cut, i)
    return text[:cut]
