"""Before any arm starts (`qa run` and its dry run, via qa.pipeline.preflight): every arm whose kv spec reads a
model folder's K/V scales (`scales = "DIR"`) gets them resolved for its format by
quant.scales.folder.resolve_folder_scales, fitted against its own model, so a folder whose numbers are all
1.0 or fit another convention than it declares is refused in one line (QuantError, exit 2) unless the spec
says `scales_as_is = true`. The arms: an hf arm (the emulator), a vllm arm with `engine_args.kv` and an
openai arm whose vLLM server has `server.kv` (both the qa_kv plugin, which reads the folder the same way).
The observation is kept (evals.provenance.scale_fits) for the hf emulator's provenance, which reads it back.

Where the fit runs: here, in the `qa run` process, with transformers in this environment, once per model
(the dry run too: it loads the model to fit, and keeps nothing): the model is loaded as an hf arm loads it
(a vLLM arm's: on the CPU, in the dtype its `dtype` flag names, float32 for "auto"; vLLM itself is not
started) and runs FIT_PROMPTS chunks of FIT_TOKENS WikiText-2 tokens (the calibration set of `qa
calibrate`, from the run's data dir or $QA_DATA_DIR), then freed before any arm starts. Conventions are 6x
and 448x apart and the fit tolerates sqrt(6) either way, so a few hundred tokens are enough. SmolLM2-135M on
a 2-core CPU shared at load average ~9: model load 13 s, the WikiText-2 chunks 4 s, the 4 forward passes 5 s
(the load is the cost; the arm loads the model again in its own process). A folder whose arm's model
transformers cannot load here (a model only vLLM runs) is refused unless the spec says `scales_as_is =
true` (then the arm's note says it was not fitted); the dry run notes what it cannot fit here instead."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from evals.engines.hf.args import HFEngineArgs
from evals.engines.vllm.args import VllmEngineArgs
from evals.errors import ModelError
from evals.models.load import load_model
from evals.models.resolve import ResolvedModel
from evals.provenance.scale_fits import save_observed
from evals.servers.spec import VllmServerSpec
from qa.pipeline.resolved_run import ResolvedArm, ResolvedRun
from quant.errors import QuantError
from quant.kv.spec import KVQuantSpec
from quant.scales.folder import ObservedAmax, ResolvedScales, read_folder_scales, resolve_folder_scales

FIT_DATA = "wikitext2"
FIT_PROMPTS = 4  # chunks observed: 4 x 128 = 512 tokens (the fit's tolerance is sqrt(6), module docstring)
FIT_TOKENS = 128
FIT_SEED = 0
# vLLM's `dtype` flag -> the torch dtype the fit loads the model in (vLLM's "auto" and others: float32)
VLLM_DTYPES: dict[str, str] = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16",
                               "float16": "float16", "half": "float16"}


@dataclass(frozen=True)
class FolderSource:
    """An arm whose static K/V scales come from a model folder."""

    kv: KVQuantSpec  # the arm's kv spec (the format the folder is resolved for, scales_as_is)
    folder: Path
    load: HFEngineArgs  # how the fit loads the arm's model with transformers (dtype, device, trust_remote_code)
    reader: str  # who reads the folder in the arm: "the hf emulator", "the vLLM qa_kv plugin"


def vllm_load(flags: Mapping[str, object]) -> HFEngineArgs:
    """How the fit loads a vLLM arm's model with transformers: on the CPU, in the dtype of its `dtype` flag."""
    return HFEngineArgs(dtype=VLLM_DTYPES.get(str(flags.get("dtype", "auto")), "float32"),  # type: ignore[arg-type]
                        trust_remote_code=flags.get("trust_remote_code") is True)


def folder_source(arm: ResolvedArm) -> FolderSource | None:
    """The folder an arm's static K/V scales come from (hf engine_args, vllm engine_args.kv, a vLLM server's
    kv), with how to fit it; None for an arm that reads none."""
    args, server = arm.engine_args, arm.server
    if isinstance(args, HFEngineArgs):
        kv, source, load, reader = args.kv, args.scales_source, args, "the hf emulator"
    elif isinstance(args, VllmEngineArgs) and args.kv is not None:
        kv, load, reader = args.kv, vllm_load(args.flags()), "the vLLM qa_kv plugin"
        source = kv.scales_file
    elif isinstance(server, VllmServerSpec) and server.kv is not None:
        kv, load, reader = server.kv, vllm_load(server.args), "the vLLM qa_kv plugin"
        source = kv.scales_file
    else:
        return None
    if kv is None or source is None or not Path(source).is_dir():
        return None
    return FolderSource(kv=kv, folder=Path(source), load=load, reader=reader)


def observe_model(model: ResolvedModel, hf: HFEngineArgs, data_dir: Path | None) -> ObservedAmax:
    """amax of `model`'s K/V per layer on FIT_PROMPTS x FIT_TOKENS WikiText-2 tokens, loaded as `hf` says
    (dtype, device, trust_remote_code) and freed after; ModelError when transformers cannot load it."""
    import torch  # torch: the model runs
    from transformers.utils import logging as hf_logging  # transformers: its load progress bar

    from qa.pipeline.calibration import load_prompts  # torch: token chunks are tensors
    from quant.kv.scale_check import observe_amax  # torch: the model runs

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a check before the run: its stderr is one error line or nothing
    try:
        hf_model, tokenizer = load_model(model, dtype=hf.dtype, device=hf.device,
                                         trust_remote_code=hf.trust_remote_code)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    name, prompts = load_prompts(tokenizer, FIT_DATA, data_dir, FIT_PROMPTS, FIT_TOKENS, FIT_SEED)
    observed = observe_amax(hf_model, prompts.to(hf.device),
                            f"{model.name} on {name}: {prompts.shape[0]} x {prompts.shape[1]} tokens")
    del hf_model
    if hf.device.startswith("cuda"):
        torch.cuda.empty_cache()  # the arm's own process loads the model next
    return observed


def fit_note(rs: ResolvedScales, reader: str, unfitted: str | None = None) -> str:
    """One line for the dry run: declared, fitted (or why not: `unfitted`), what the format reads."""
    fit = rs.fit
    fitted = (f"fit {fit.convention or 'none'} (median ratio {fit.ratio:.3g}) on {rs.fit_on}" if fit else
              f"not fitted ({unfitted or 'no model observed'})")
    read = (f"; {reader}'s {rs.kv_format} cache reads them as {rs.read_as.name} ({rs.read_as.formula})"
            if rs.read_as is not None else "")
    taken = f"; taken as it is: {rs.problems[0]}" if rs.problems else ""
    return (f"K/V scales of {rs.scales.folder}: declared {rs.declared.name} ({rs.declared.formula}, "
            f"{rs.scales.declared_by}); {fitted}{read}{taken}")


def _observed(arm: ResolvedArm, src: FolderSource, run: ResolvedRun, seen: dict[str, ObservedAmax],
              strict: bool) -> tuple[ObservedAmax | None, str | None]:
    """(amax observed on the arm's model, None), or (None, why not) where it cannot be observed and the spec
    takes the folder as it is or this is a dry run (`strict` False); QuantError (one line) otherwise."""
    why = None
    if arm.model is None:
        why = f"its model is not on this machine: {arm.problem or arm.record.model}"
    elif arm.model.name not in seen:
        try:
            seen[arm.model.name] = observe_model(arm.model, src.load, run.data_dir)
        except ModelError as exc:
            why = f"transformers cannot load it here: {exc}"
    if why is None:
        assert arm.model is not None  # checked above
        return seen[arm.model.name], None
    if src.kv.scales_as_is:
        return None, why
    fix = "run where its model loads, or set scales_as_is = true in the kv spec to run them as declared"
    if not strict:
        return None, f"{why}; `qa run` refuses them unless it can fit them: {fix}"
    raise QuantError(f"the K/V scales of {src.folder} cannot be fitted against the arm's model ({why}); {fix}")


def fit_scale_folders(run: ResolvedRun, *, strict: bool = True) -> dict[str, tuple[str, ...]]:
    """Resolve and fit every arm's folder scales (module docstring): a note per arm; QuantError on the first
    folder refused. `strict` (`qa run`): keep each observation for the arm's provenance, and refuse a folder
    that cannot be fitted here; the dry run writes nothing and notes it instead."""
    notes: dict[str, tuple[str, ...]] = {}
    seen: dict[str, ObservedAmax] = {}  # model name -> amax observed, one load per model
    for arm in run.arms:
        src = folder_source(arm)
        if src is None:
            continue
        try:
            observed, unfitted = _observed(arm, src, run, seen, strict)
            if strict and observed is not None and arm.model is not None:
                save_observed(read_folder_scales(src.folder), arm.model.name, observed)
            rs = resolve_folder_scales(src.folder, src.kv.format, take_as_is=src.kv.scales_as_is, observed=observed)
        except QuantError as exc:
            raise QuantError(f"arm {arm.name!r}: {exc}") from None
        notes[arm.name] = (fit_note(rs, src.reader, unfitted),)
    return notes
