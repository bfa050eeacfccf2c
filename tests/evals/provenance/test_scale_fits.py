"""evals.provenance.scale_fits: the amax `qa run`'s preflight observed, kept under $QA_CACHE_DIR for one model and one
folder's stored numbers, read back unchanged (and by nothing else), and what run_arm then writes into
arm.json: the folder's reading fitted on that observation (fitted, fit_ratio, fit_on, problems)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.provenance.record import KVProvenance
from evals.provenance.scale_fits import FITS_DIR, fit_path, load_observed, save_observed
from evals.records.arm_file import ARM_FILE
from evals.run.arm import parse_arm, run_arm
from quant.scales.folder import ObservedAmax, read_folder_scales
from tests.evals.run.test_runner import EchoTask
from tests.quant.ckpt_folders import k_scale_folder

K, V = [0.02, 0.03], [0.01, 0.04]  # the tiny model's 2 layers: fp8-decode numbers (amax / 448)


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("QA_CACHE_DIR", str(root))
    return root


def _observed(per_amax: float, on: str = "tiny on wikitext2: 4 x 128 tokens") -> ObservedAmax:
    """The amax a folder of K, V numbers stands for if each number is amax / per_amax."""
    return ObservedAmax(k=[x * per_amax for x in K], v=[x * per_amax for x in V], on=on)


def test_an_observation_round_trips_for_its_model_and_numbers_only(cache: Path, tmp_path: Path) -> None:
    scales = read_folder_scales(k_scale_folder(tmp_path / "a", K, V, num_bits=8))
    assert load_observed(scales, "tiny") is None  # nothing kept yet
    seen = _observed(448.0 * 1.1)
    path = save_observed(scales, "tiny", seen)
    assert path == fit_path(scales, "tiny") and path.parent == cache / FITS_DIR
    assert load_observed(scales, "tiny") == seen  # the same floats, and what they were observed on
    assert load_observed(scales, "other-model") is None  # another model's amax is not this one's
    same = read_folder_scales(k_scale_folder(tmp_path / "copy", K, V, num_bits=8))
    assert load_observed(same, "tiny") == seen  # keyed by the stored numbers, not the folder's path
    other = read_folder_scales(k_scale_folder(tmp_path / "b", [0.02, 0.031], V, num_bits=8))
    assert load_observed(other, "tiny") is None  # other numbers: the observation is not reused
    again = _observed(448.0, on="tiny on wikitext2: 8 x 128 tokens")
    save_observed(scales, "tiny", again)
    assert load_observed(scales, "tiny") == again  # replaced, not appended
    path.write_text('{"k": [1.0], "v": "not a list"}')
    assert load_observed(scales, "tiny") is None  # an unreadable record is no fit


@pytest.mark.parametrize(("per_amax", "fitted", "problem"), [
    (448.0 * 1.1, "fp8-decode", None),  # what the folder declares, 10% off
    (6.0, "nvfp4-global",  # amax / 6: 448 / 6 = 74.6667 times what the folder declares
     "declared fp8-decode (amax / 448) but the numbers fit nvfp4-global (amax / 6): off by 74.6667x"),
])
def test_run_arm_records_the_fit_it_finds_kept_for_its_model(cache: Path, tmp_path: Path, per_amax: float,
                                                            fitted: str, problem: str | None) -> None:
    folder = k_scale_folder(tmp_path / "tiny", K, V, num_bits=8)  # a model folder that carries its scales
    seen = _observed(per_amax)
    save_observed(read_folder_scales(folder), str(folder), seen)  # as the preflight keeps it, by model name
    config = parse_arm({"name": "cand", "model": str(folder), "limit": 2,
                        "engine_args": {"batch_size": 2, "kv": {"format": "nvfp4", "scales": str(folder)}}})
    run_arm(config, [EchoTask(n_items=2)], tmp_path / "run", progress=False)
    manifest = json.loads((tmp_path / "run" / "records" / "cand" / ARM_FILE).read_text())
    kv = KVProvenance.model_validate(manifest["engine_info"]["kv"])
    reading = kv.folder_scales
    assert reading is not None and (reading.declared, reading.read_as) == ("fp8-decode", "nvfp4-decode")
    assert (reading.fitted, reading.fit_on, reading.taken_as_is) == (fitted, seen.on, False)
    assert reading.fit_ratio == pytest.approx(448.0 / per_amax if fitted == "fp8-decode" else 1.0)
    assert reading.problems == ([problem] if problem else [])
    assert f"(declared fp8-decode, fitted {fitted})" in kv.summary()
