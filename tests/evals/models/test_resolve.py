"""evals.models.resolve: a local folder resolves to itself with its weights file's sha256, one whose config.json
is missing or not a transformers config is one ModelError line, and an unknown name gets a did-you-mean."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from evals.errors import ModelError
from evals.models.resolve import resolve_model


def _folder(tmp_path: Path, config: str | None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config)
    return folder


def test_a_local_folder_is_hashed_by_its_one_weights_file(tmp_path: Path) -> None:
    folder = _folder(tmp_path, json.dumps({"model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"weights")
    got = resolve_model(str(folder))
    assert got.path == folder.resolve() and got.hub_id is None and got.load_id == str(folder.resolve())
    assert got.file_hash == hashlib.sha256(b"weights").hexdigest()
    (folder / "model-2.safetensors").write_bytes(b"more")
    assert resolve_model(str(folder)).file_hash is None  # sharded: no one file to name


@pytest.mark.parametrize(("config", "match"), [
    (None, r"not a model folder \(no config.json\)"),
    ("[1, 2]", "config.json: expected a JSON object, got list"),
    ('{"model_type": "llama",', "config.json: not valid JSON"),
    ('{"model_type": "llama", "num_hidden_layers": "two"}', "config.json: not a valid model config: .*num_hidden_layers"),
])
def test_a_folder_without_a_valid_config_is_one_line(tmp_path: Path, config: str | None, match: str) -> None:
    with pytest.raises(ModelError, match=match) as err:
        resolve_model(str(_folder(tmp_path, config)))
    assert "\n" not in str(err.value)


def test_an_unknown_name_gets_a_did_you_mean() -> None:
    with pytest.raises(ModelError, match=r"unknown model 'smollm2-13m' .*did you mean 'smollm2-135m'"):
        resolve_model("smollm2-13m")
