"""The arm.json contract: what `records/<arm>/arm.json` holds (an ArmManifest), read and written here.

It holds the arm's resolved configuration (ArmIdentity) and its fingerprint (sha256 of the canonical JSON of
model, model file hash, engine, the engine arguments as the spec set them, limit, repeats, seed; its server
settings and env when it has them) plus one fingerprint per task (name, version, options), what the engine said
of itself and where reused records came from (neither fingerprinted). The canonical JSON
(evals.records.fingerprint) is the one arm.json files have always been fingerprinted with, and `to_json` keeps
the shape they have always had, so older folders still resume (evals.run.arm).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from evals.engines import EngineName
from evals.engines.load import LoadRecord
from evals.engines.openai_api.load import ServedLoadRecord
from evals.engines.vllm.kv.record import KVExecution
from evals.errors import RecordError
from evals.provenance.record import KVProvenance
from quant.fileio import atomic_write_text
from quant.validation import first_error

ARM_FILE = "arm.json"
ARM_SCHEMA = 1
RESUME_HINT = "use a new output folder, or delete it to start over"


class TaskEntry(BaseModel):
    """What identifies one task's configuration in arm.json, with its fingerprint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: str
    config: JsonValue  # the options (or the task's own fields), canonical JSON
    limit: int | None = None  # only when it overrides the arm's
    repeats: int | None = None
    fingerprint: str

    def identity(self) -> dict[str, JsonValue]:
        """The fingerprinted part (limit and repeats only when they are set)."""
        out: dict[str, JsonValue] = {"name": self.name, "version": self.version, "config": self.config}
        if self.limit is not None:
            out["limit"] = self.limit
        if self.repeats is not None:
            out["repeats"] = self.repeats
        return out


class ArmIdentity(BaseModel):
    """What identifies an arm's configuration (arm.json `config`); its digest is the arm fingerprint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    model: str
    model_file_hash: str | None
    engine: EngineName
    # as the spec set them; scales files by name only; a started server's base_url left out
    engine_args: dict[str, JsonValue]
    engine_files: dict[str, str]  # "<arg>:<file name>" -> sha256 of every scales file the arguments name
    limit: int | None
    repeats: int
    seed: int
    server: dict[str, JsonValue] | None = None
    env: dict[str, str] = Field(default_factory=dict)  # secrets' values redacted (evals.records.env.redact_env)

    def canonical(self) -> dict[str, JsonValue]:
        """The JSON the fingerprint is the digest of (`server` and `env` only when the arm has them, so
        older arms keep their fingerprints)."""
        left_out = ({"server"} if self.server is None else set()) | (set() if self.env else {"env"})
        return self.model_dump(mode="json", exclude=left_out)


class EngineSummary(BaseModel):
    """What the engine says of itself (not fingerprinted): the report warns when it is not reproducible."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    deterministic: bool
    kv: KVProvenance | None = None  # the KV cache and K/V scales the engine really ran with
    # the qa_kv plugin's per-layer device counts over the arm, checked against the tokens vLLM computed
    kv_execution: KVExecution | None = None
    # a loaded arm: what its requests were served amid (offline vLLM's scheduler counters; a served arm's client
    # count and server /metrics)
    load: LoadRecord | ServedLoadRecord | None = None


class ReusedFrom(BaseModel):
    """Where an arm's records were copied from (evals.run.reuse): not fingerprinted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_dir: str  # the earlier run directory, absolute
    fingerprint: str  # that run's arm.json fingerprint (equal to this arm's: the copy was checked)


class ArmManifest(BaseModel):
    """The content of `records/<arm>/arm.json`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = ARM_SCHEMA
    config: ArmIdentity
    fingerprint: str
    tasks: dict[str, TaskEntry]
    engine_info: EngineSummary | None = None
    reused_from: ReusedFrom | None = None

    @classmethod
    def load(cls, path: Path) -> Self:
        """Read arm.json; RecordError (one line) when it is not a manifest this toolkit can resume."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            raise RecordError(f"{path}: not a valid arm manifest; {RESUME_HINT}") from None
        if not isinstance(data, dict):
            raise RecordError(f"{path}: not a valid arm manifest; {RESUME_HINT}")
        if data.get("schema_version") != ARM_SCHEMA:
            raise RecordError(f"{path}: manifest schema {data.get('schema_version')!r}, this toolkit writes "
                              f"{ARM_SCHEMA}; {RESUME_HINT}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = first_error(exc)
            raise RecordError(f"{path}: not a valid arm manifest ({err.where_or('file')}: {err.msg}); "
                              f"{RESUME_HINT}") from None

    def to_json(self) -> dict[str, JsonValue]:
        """The arm.json document (the shape it has always had)."""
        out: dict[str, JsonValue] = {
            "schema_version": self.schema_version,
            "config": self.config.canonical(),
            "fingerprint": self.fingerprint,
            "tasks": {name: {**entry.identity(), "fingerprint": entry.fingerprint}
                      for name, entry in self.tasks.items()},
        }
        if self.engine_info is not None:
            out["engine_info"] = self.engine_info.model_dump(mode="json", exclude_none=True)
        if self.reused_from is not None:
            out["reused_from"] = self.reused_from.model_dump(mode="json")
        return out

    def save(self, path: Path) -> None:
        """Write arm.json atomically (sorted keys, two-space indent)."""
        atomic_write_text(path, json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
