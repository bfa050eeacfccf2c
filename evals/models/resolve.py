"""Model resolution: a named model (evals.models.named, converted from its GGUF on first use), a local HF folder
or a hub id becomes a ResolvedModel, the folder to load and the hash of the weights file it was made from.
Everything runs offline unless asked (evals.offline.hub_offline)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evals.errors import ModelError
from evals.models.config import check_config_json
from evals.models.gguf import converted_folder, gguf_path
from evals.models.hub import hub_folder
from evals.models.named import NAMED_MODELS
from quant.fileio import sha256_file
from quant.validation import did_you_mean


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


def named_model(name: str) -> ResolvedModel:
    """A named model: the HF folder its GGUF converts to, hashed by the GGUF's sha256."""
    spec = NAMED_MODELS[name]
    gguf = gguf_path(spec, name)
    digest = sha256_file(gguf)
    return ResolvedModel(name=name, path=converted_folder(spec, name, gguf, digest), hub_id=spec.hf_id,
                         file_hash=digest)


def local_folder(name: str, path: Path) -> ResolvedModel:
    """A local HF folder: ModelError (one line) unless its config.json is one transformers accepts
    (evals.models.config.check_config_json); hashed by its weights file when it has exactly one."""
    if not (path / "config.json").exists():
        raise ModelError(f"{path}: not a model folder (no config.json)")
    check_config_json(path)
    weights = sorted(path.glob("*.safetensors"))
    return ResolvedModel(name=name, path=path.resolve(), hub_id=None,
                         file_hash=sha256_file(weights[0]) if len(weights) == 1 else None)


def resolve_model(name: str) -> ResolvedModel:
    """Resolve a named model, a local HF folder or a hub id; convert named GGUF models on first use."""
    if name in NAMED_MODELS:
        return named_model(name)
    path = Path(name).expanduser()
    if path.is_dir():
        return local_folder(name, path)
    if path.suffix == ".gguf" or "/" not in name:
        hint = did_you_mean(name, NAMED_MODELS, listing="named models")
        raise ModelError(f"unknown model {name!r} (not a named model, a model folder or an org/name hub id); {hint}")
    return ResolvedModel(name=name, path=hub_folder(name), hub_id=name, file_hash=None)
