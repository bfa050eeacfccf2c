"""torch.compile plumbing shared by the compiled KV-cache paths (`quant.formats.nvfp4_fused`, `quant.formats.fp8_fused`,
`quant.formats.capture`).

Inputs have their row (token) count marked dynamic, so one compile serves every batch and token count. The
hf cache's compiled paths run for CPU tensors only, and only once a process has made `QA_KV_COMPILE_AFTER`
writes (default 4096) eagerly (`enabled`): a compile costs about 4 s with inductor's disk cache and 10-15 s
without, about what 4096 eager writes of a small model cost, so a short run (a smoke test, a few items, an
inspection) never pays for one and a long run pays once, early. The values-only K/V rewrite
(`quant.formats.capture`) runs compiled on any device inductor compiles for from its first call (`usable`):
it is installed before vLLM captures CUDA graphs. Compiled code keeps eager's float32 numerics
(`EAGER_NUMERICS`). `QA_KV_COMPILED=0` turns every compiled path off. A compile or runtime failure (no C++
compiler, an unsupported op) logs one warning and turns them off for the process: the callers then take
their eager path, which gives the same bytes and values.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from quant.errors import QuantError

log = logging.getLogger(__name__)
ENV = "QA_KV_COMPILED"  # "0" turns the compiled KV-cache paths off
WARMUP_ENV = "QA_KV_COMPILE_AFTER"  # hf cache writes a process makes eagerly before its compiled path starts
DEFAULT_WARMUP = 4096
_failed: list[str] = []  # the first failure's message, once one happened
_eager_writes: list[int] = [0]  # the writes `enabled` sent eagerly while warming up


# specializations per compiled function: one per (K, input dtype, output dtype, static argument). A
# run needs a few; a process that quantizes several formats, head sizes and dtypes (the test suite) more
# than dynamo's default 8, after which a fullgraph function raises instead of compiling again
RECOMPILE_LIMIT = 256
# inductor options that keep eager's float32 results on CUDA (Triton): x / y correctly rounded (Triton's
# `/` is an approximate division), no flush of subnormals to zero, no a * b + c contracted into one FMA
# and no dropped bf16/fp16 round trips (emulate_precision_casts). CPU code is IEEE already; they cost it nothing
EAGER_NUMERICS: dict[str, bool] = {
    "emulate_precision_casts": True,
    "eager_numerics.division_rounding": True,
    "eager_numerics.disable_ftz": True,
}


@functools.cache
def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn compiled once per process (inductor also caches its code on disk across processes)."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
    return torch.compile(fn, fullgraph=True, options=EAGER_NUMERICS)


def rows(t: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """t [R, ...] as a compiled function's input with a dynamic row count (the size of `dim`)."""
    # detach: a reshaped view would make dynamo guard on the sizes of its base tensor (one recompile
    # per new base shape); the row count is a hint, so 0/1-row calls may still specialize
    t = t.detach()
    torch._dynamo.maybe_mark_dynamic(t, dim)
    return t


def per_row(scale: torch.Tensor, lead: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A scale of shape () or broadcastable to [..., 1] expanded to one value per row: float32 [R, 1]."""
    return scale.to(device=device, dtype=torch.float32).expand(*lead, 1).reshape(-1, 1).contiguous()


def usable() -> bool:
    """Whether compiled paths may run at all: not switched off with QA_KV_COMPILED=0, and no compiled call
    failed earlier in this process."""
    return os.environ.get(ENV, "1") != "0" and not _failed


def failure() -> str | None:
    """The first compiled call's failure in this process (type and first line), None when none failed."""
    return _failed[0] if _failed else None


def warmup() -> int:
    """The eager writes before the hf cache's compiled path starts ($QA_KV_COMPILE_AFTER, default 4096)."""
    raw = os.environ.get(WARMUP_ENV, "")
    try:
        return max(int(raw), 0) if raw else DEFAULT_WARMUP
    except ValueError:
        raise QuantError(f"{WARMUP_ENV}={raw!r}: give a whole number of writes (0: compile from the first)") from None


def enabled(x: torch.Tensor) -> bool:
    """Whether a compiled path runs for x [..., K]: a CPU tensor with at least 2 rows, not switched
    off with QA_KV_COMPILED=0, no compiled call failed earlier in this process, and this process past its
    warm-up (`warmup`: each call before then counts one eager write)."""
    if not (x.device.type == "cpu" and x.dim() > 0 and x.numel() >= 2 * x.shape[-1] and usable()):
        return False
    if _eager_writes[0] < warmup():
        _eager_writes[0] += 1
        return False
    return True


def call(fn: Callable[..., Any], what: str, *args: Any) -> Any | None:
    """compiled(fn)(*args), or None after logging one warning when compiling or running it fails."""
    try:
        return compiled(fn)(*args)
    except Exception as exc:  # noqa: BLE001 - any compiler or runtime failure: the caller goes eager
        _failed.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
        log.warning("compiled %s KV path unavailable (%s); quantizing eagerly", what, _failed[0])
        return None
