"""env.json as a versioned model: every committed one loads, a fresh one round-trips, bad files are
one-line RecordErrors, and no environment variable but the offline switches is recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.errors import RecordError
from evals.records.env import ENV_SCHEMA, EnvInfo, collect_env

REPO = Path(__file__).resolve().parents[3]
# reports/runs/ is where `qa run` writes by default (git-ignored): not committed
COMMITTED = sorted(p for p in (REPO / "reports").glob("**/env.json") if "runs" not in p.relative_to(REPO).parts[:2])


def test_the_reports_have_env_files() -> None:
    assert REPO / "reports" / "reference" / "env.json" in COMMITTED


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(REPO)))
def test_committed_env_files_load(path: Path) -> None:
    env = EnvInfo.load(path)
    raw = json.loads(path.read_text())
    assert env.schema_version == ENV_SCHEMA  # files written before the field existed read as version 1
    raw.pop("schema_version", None)
    assert env.model_dump(mode="json", exclude={"schema_version"}) == raw  # nothing lost or added


def test_reference_env_values() -> None:
    env = EnvInfo.load(REPO / "reports" / "reference" / "env.json")
    assert env.model_hashes["smollm2-135m"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert env.hardware.cpu_count == 2 and env.hardware.gpu is None
    assert env.packages["lm-eval"] == "0.4.13"


def test_collected_env_round_trips_and_records_no_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QA_TEST_SECRET_KEY", "sk-must-not-appear")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    env = collect_env(model_hashes={"m": "ab" * 32, "hub/model": None}, data_hashes={"gsm8k/test.jsonl": "cd" * 32})
    path = tmp_path / "env.json"
    env.write(path)
    text = path.read_text()
    assert "sk-must-not-appear" not in text and json.loads(text)["schema_version"] == ENV_SCHEMA
    assert EnvInfo.load(path) == env
    assert env.offline["HF_HUB_OFFLINE"] == "1" and set(env.offline) == {"HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"}
    assert env.packages["pydantic"] and env.hardware.python


@pytest.mark.parametrize(("content", "match"), [
    ("{nope", "cannot read env.json"),
    (json.dumps({"git_sha": None}), "not an env.json of schema 1: packages"),
    (json.dumps({"schema_version": 2}), "schema_version"),
])
def test_bad_env_files_are_one_line_record_errors(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "env.json"
    path.write_text(content)
    with pytest.raises(RecordError, match=match) as info:
        EnvInfo.load(path)
    assert "\n" not in str(info.value)
    with pytest.raises(RecordError, match="cannot read"):
        EnvInfo.load(tmp_path / "missing.json")


def test_arm_env_is_recorded_with_secrets_redacted(tmp_path: Path) -> None:
    from evals.records.env import REDACTED, redact_env

    given = {"VLLM_CPU_KVCACHE_SPACE": "4", "HF_TOKEN": "hf_must_not_appear", "MY_API_KEY": "key-must-not-appear",
             "DB_PASSWORD": "pw-must-not-appear", "AWS_SECRET_ACCESS_KEY": "aws-must-not-appear",
             "GOOGLE_APPLICATION_CREDENTIALS": "/creds-must-not-appear.json"}
    assert redact_env(given) == {"VLLM_CPU_KVCACHE_SPACE": "4", **{k: REDACTED for k in list(given)[1:]}}
    env = collect_env(model_hashes={}, data_hashes={}, arm_env={"candidate": given, "baseline": {}})
    path = tmp_path / "env.json"
    env.write(path)
    text = path.read_text()
    assert all(v not in text for k, v in given.items() if k != "VLLM_CPU_KVCACHE_SPACE")
    assert EnvInfo.load(path).arm_env == {"candidate": redact_env(given)}  # arms without env left out


def test_arm_manifest_records_env_redacted_and_old_fingerprints_stay() -> None:
    from evals.models.resolve import ResolvedModel
    from evals.records.env import REDACTED
    from evals.run.arm import ArmConfig, arm_manifest

    model = ResolvedModel(name="m", path=None, hub_id="org/m", file_hash=None)
    plain = arm_manifest(ArmConfig(name="a", model="m", engine="hf", engine_args={}), model, [])
    assert "env" not in plain.config.canonical() and "env" not in plain.to_json()["config"]  # type: ignore[operator]
    with_env = arm_manifest(ArmConfig(name="a", model="m", engine="hf", engine_args={},
                                      env={"VLLM_CPU_KVCACHE_SPACE": "4", "HF_TOKEN": "hf_must_not_appear"}),
                            model, [])
    assert with_env.config.canonical()["env"] == {"VLLM_CPU_KVCACHE_SPACE": "4", "HF_TOKEN": REDACTED}
    assert with_env.fingerprint != plain.fingerprint and "hf_must_not_appear" not in json.dumps(with_env.to_json())
