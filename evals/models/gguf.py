"""A named model's GGUF file and the HF folder it becomes: the file is found inside its package (or assembled
by it into `$QA_CACHE_DIR/gguf`); on first use transformers dequantizes it and saves a plain HF folder in the
cache (under `models/`), so later loads take about a second and vLLM can load the same folder; what the GGUF
lacks and the upstream model has is written into that folder (evals.models.named). Both the assembled file and
the folder are built aside and renamed into place (quant.fileio.publish_once): processes resolving the same
model at once build it once, the others wait and reuse it, and none sees a partial one."""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
from collections.abc import Callable
from pathlib import Path

from evals.errors import ModelError
from evals.models.cache import cache_root
from evals.models.named import NAMED_MODELS, GGUFModel
from quant.fileio import atomic_write_text, publish_once, sha256_file

log = logging.getLogger(__name__)


def waiting_for(what: Path) -> Callable[[], None]:
    """What publish_once calls when another process is building `what`: one log line, so a wait of minutes
    is not silent."""
    return lambda: log.warning("waiting for another process to finish building %s", what)


def gguf_file(name: str) -> Path:
    """The GGUF file behind a named model (what llama.cpp's server loads); ModelError otherwise."""
    if name not in NAMED_MODELS:
        raise ModelError(f"model {name!r} is not a named GGUF model ({', '.join(NAMED_MODELS)}); give the GGUF path")
    return gguf_path(NAMED_MODELS[name], name)


def gguf_path(spec: GGUFModel, name: str) -> Path:
    """The GGUF file of the named model `name` (its package's file, or the one it assembles); ModelError when
    the package is missing or holds no file."""
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
            assemble = getattr(module, "assemble", None)
            file_name = getattr(module, "MODEL_NAME", None)
            if callable(assemble) and isinstance(file_name, str):  # into our cache, not the package's default
                target = cache_root() / "gguf" / file_name  # the package writes in place: it assembles aside
                publish_once(target, lambda path: assemble(path, overwrite=True), waiting_for(target))
                expected = getattr(module, "EXPECTED_SHA256", None)  # a file torn by an in-place writer
                if isinstance(expected, str) and sha256_file(target) != expected:
                    raise ValueError(f"{target} is not the file it assembles (sha256 differs); delete it to rebuild")
                return target
            for attr in ("get_model_path", "model_path", "get_path"):
                fn = getattr(module, attr, None)
                if callable(fn):
                    p = Path(fn())
                    if p.exists():
                        return p
        except Exception as exc:  # noqa: BLE001 - third-party assembly failures become one line
            raise ModelError(f"model {name!r}: its package failed to assemble the GGUF file ({exc})") from None
    raise ModelError(f"model {name!r}: the GGUF file is missing from package {spec.package}; reinstall: {spec.pip_hint}")


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint with transformers and save it as a plain HF folder `out`, written in place
    (converted_folder publishes it atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # transformers: only on a GGUF's first use

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are already dequantized; the GGUF quantizer only blocks save_pretrained.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "SOURCE_SHA256").write_text(sha256_file(gguf) + "  " + gguf.name + "\n")


def add_upstream_files(spec: GGUFModel, folder: Path) -> None:
    """Write what the GGUF lacks into a converted folder (idempotent): the chat template transformers
    reads from chat_template.jinja, and the stop ids into generation_config.json."""
    if spec.chat_template and not (folder / "chat_template.jinja").exists():
        atomic_write_text(folder / "chat_template.jinja", spec.chat_template)
    gen_path = folder / "generation_config.json"
    if spec.eos_token_ids and gen_path.exists():
        gen = json.loads(gen_path.read_text())
        have = gen.get("eos_token_id")
        have_ids = set(have if isinstance(have, list) else [have] if have is not None else [])
        if not set(spec.eos_token_ids) <= have_ids:
            gen["eos_token_id"] = sorted(have_ids | set(spec.eos_token_ids))
            atomic_write_text(gen_path, json.dumps(gen, indent=2) + "\n")


def converted_folder(spec: GGUFModel, name: str, gguf: Path, digest: str) -> Path:
    """The HF folder the named model `name` (its GGUF `gguf`, of sha256 `digest`) is converted to in the cache:
    converted on first use with the upstream files added, then published whole (quant.fileio.publish_once)."""
    out = cache_root() / "models" / f"{name}-{digest[:12]}"

    def build(path: Path) -> None:
        convert_gguf(gguf, path)
        add_upstream_files(spec, path)

    publish_once(out, build, waiting_for(out))
    add_upstream_files(spec, out)  # a folder converted before its model had upstream files gets them
    return out
