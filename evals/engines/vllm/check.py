"""vLLM arguments checked by vLLM itself, before any arm runs, in the interpreter that will run them.

`check_with_vllm(checks, python)` runs `python -m evals.engines.vllm.check OUT` (the interpreter of
vLLM arms and servers: evals.servers.interpreter.vllm_python()) with the checks as JSON on stdin; the child
imports vLLM, loads no weights, and writes one CheckReport to OUT:
- a server arm: its exact command line (evals.servers.commands.vllm_server_command) parsed by vLLM's own
  api_server parser (`make_arg_parser(FlexibleArgumentParser())`, `validate_parsed_serve_args`), then
  `AsyncEngineArgs.from_cli_args`;
- an offline arm: every `LLM(...)` keyword a field of vLLM's `EngineArgs` (did-you-mean), values
  parsed by vLLM's EngineArgs CLI parser, data_parallel_size 1, `EngineArgs(**kwargs)` built;
- both: kv_cache_dtype against the attention backend that will run it (evals.engines.vllm.offline's
  supported_kv_dtypes/check_kv_dtype), every VLLM_* variable of the arm's env known to vLLM, and for an arm
  with a `kv` table that the qa_kv plugin is registered here, not left out, and knows this vLLM's attention.
Every refusal is one line. The model is not looked up (a GPU spec's hub id need not be here).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from evals.engines.vllm.args import check_flag_names, check_offline_flags, cli_flags, parse_vllm_args
from evals.engines.vllm.kv.plugin import unrecognised_vllm
from evals.engines.vllm.offline import check_kv_dtype, engine_arg_names, supported_kv_dtypes
from evals.errors import EngineError, first_line
from evals.offline import offline_env, scoped_env
from quant.kv.spec import kv_spec_from_dict
from quant.validation import did_you_mean

CHECK_MODULE = "evals.engines.vllm.check"
CHECK_TIMEOUT_S = 300.0  # importing vLLM takes 13-20 s on a busy 2-core machine
CPU_KV_NOTE = ("no kv_cache_memory_bytes: vLLM-CPU reserves 92% of RAM for the KV cache "
               "(set e.g. kv_cache_memory_bytes = 1073741824)")


class ArmCheck(BaseModel):
    """What one arm hands vLLM: a server's command-line flags or an offline arm's `LLM(...)` keywords."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arm: str
    kind: Literal["server", "offline"]
    argv: list[str] = Field(default_factory=list)  # server: the command line after `python -m MODULE`
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)  # offline: LLM keywords, model included
    env: dict[str, str] = Field(default_factory=dict)  # the arm's own variables
    allow_unsupported_kv_cache_dtype: bool = False
    gpu_spec: bool = False  # written for GPUs: on a CPU machine vLLM checks the KV dtype where it runs
    kv: dict[str, JsonValue] | None = None  # the K/V format the qa_kv plugin emulates (a KVQuantSpec dump)


class CheckOutcome(BaseModel):
    """vLLM's answer for one arm: None or the one-line refusal, and notes (what could not be checked here)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arm: str
    error: str | None = None
    notes: list[str] = Field(default_factory=list)


class CheckReport(BaseModel):
    """The child's answer: the vLLM version that checked, one outcome per arm in order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vllm: str
    outcomes: list[CheckOutcome]

    def raise_first(self) -> None:
        """EngineError naming the first refused arm (nothing when every arm passed)."""
        for out in self.outcomes:
            if out.error is not None:
                raise EngineError(f"arm {out.arm!r}: vLLM {self.vllm} refuses its arguments: {out.error}")


def check_with_vllm(checks: Sequence[ArmCheck], python: str, *,
                    timeout_s: float = CHECK_TIMEOUT_S) -> CheckReport:
    """Run the checks in `python` (a child process, JSON in and out); EngineError when the child fails."""
    payload = json.dumps([c.model_dump(mode="json") for c in checks])
    with tempfile.TemporaryDirectory(prefix="vllm-check-") as tmp:
        out = Path(tmp) / "report.json"
        try:
            proc = subprocess.run([python, "-m", CHECK_MODULE, str(out)], input=payload, text=True,
                                  capture_output=True, env=offline_env(), timeout=timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise EngineError(f"the vLLM argument check in {python} took over {timeout_s:.0f} s") from None
        except OSError as exc:
            raise EngineError(f"cannot run the vLLM argument check in {python}: {exc}") from None
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise EngineError(f"the vLLM argument check in {python} failed (exit {proc.returncode}): {tail}")
        return CheckReport.model_validate_json(out.read_text(encoding="utf-8"))


# -- the child: runs where vLLM is installed ---------------------------------------------------------


class Refused(Exception):
    """vLLM's argparse refused the command line (its `error` raises this instead of exiting)."""




@functools.cache
def raising_parser(build: Any) -> Any:
    """vLLM's FlexibleArgumentParser, filled by `build`, whose errors raise Refused instead of exiting
    (built once per `build`: parsing leaves a parser as it was)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # vllm: only in the check's child

    class RaisingParser(FlexibleArgumentParser):  # type: ignore[misc]
        def error(self, message: str) -> Any:  # argparse's hook
            raise Refused(message)

    return build(RaisingParser(prog="vllm"))


def option_names(parser: Any) -> list[str]:
    """Every long option of a parser, as argument names (`--max-model-len` -> max_model_len)."""
    return [s[2:].replace("-", "_") for a in parser._actions for s in a.option_strings if s.startswith("--")]


def refuse_unknown(parser: Any, argv: list[str], *, skip_negatives: bool = False) -> None:
    """Refused with a did-you-mean from vLLM's own options for the first token vLLM's parser does not take."""
    _, unknown = parser.parse_known_args(argv)
    known = option_names(parser)
    # argparse takes any unambiguous prefix (--enable-prefix-cachin): a typo must not pass as a flag
    unknown = [t for t in argv if t.startswith("--") and t.split("=", 1)[0][2:].replace("-", "_") not in known
               ] + unknown
    for token in unknown:
        flag = token.split("=", 1)[0]
        name = flag[2:].replace("-", "_") if flag.startswith("--") else ""
        if name.startswith("no_") and name[3:] in known:
            if skip_negatives:
                continue
            raise Refused(f"{name[3:]} = false: vLLM's --{name[3:].replace('_', '-')} has no --no- form "
                          "(not a boolean switch); leave it out for vLLM's default")
        if not name:
            raise Refused(f"vLLM's parser does not take {token!r} (a list given to a one-value flag?)")
        if name.startswith("no_"):  # the key was given as false: name it as the spec wrote it
            name, known = name[3:], [k for k in known if not k.startswith("no_")]
        raise Refused(f"unknown vLLM argument {name!r}; {did_you_mean(name, known, listing='vLLM accepts')}")


def check_env(env: Mapping[str, str]) -> None:
    """Every VLLM_* variable of an arm must be one vLLM reads (did-you-mean from vllm.envs)."""
    from vllm import envs  # vllm: only in the check's child

    known = list(envs.environment_variables)
    for name in env:
        if name.startswith("VLLM_") and name not in known:
            hint = ('the attention backend is the engine argument attention_backend (e.g. "FLASHINFER")'
                    if name == "VLLM_ATTENTION_BACKEND" else did_you_mean(name, known, listing="known"))
            raise Refused(f"env {name}: vLLM {envs_version()} reads no such variable; {hint}")


def envs_version() -> str:
    """The vLLM version of this interpreter."""
    import vllm  # vllm: only in the check's child

    return str(vllm.__version__)


def check_kv(kv_dtype: str, backend: object, *, allow: bool, gpu_spec: bool) -> list[str]:
    """kv_cache_dtype against the backend that will run it; notes for what this machine cannot check."""
    from vllm.platforms import current_platform  # vllm: this runs in the child that imported it

    name = getattr(backend, "name", backend)
    if name is None and gpu_spec and current_platform.is_cpu():
        return [f"kv_cache_dtype {kv_dtype!r}: checked by vLLM's backend selector on the GPU (none here)"]
    try:
        supported = supported_kv_dtypes(str(name) if name is not None else None)
    except EngineError:
        raise
    except Exception as exc:  # noqa: BLE001 - a GPU backend's module may not import on this machine
        return [(f"kv_cache_dtype {kv_dtype!r} not checked: attention backend {name} does not load here "
                 f"({type(exc).__name__}: {first_line(exc)})")]
    check_kv_dtype(kv_dtype, supported, allow_unsupported=allow)
    return []


def check_server(check: ArmCheck) -> list[str]:
    """Parse a server's exact command line as vLLM's api_server does and build its engine arguments."""
    from vllm.engine.arg_utils import AsyncEngineArgs  # vllm: only in the check's child
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args  # vllm: same
    from vllm.platforms import current_platform  # vllm: as above

    parser = raising_parser(make_arg_parser)
    refuse_unknown(parser, check.argv)
    ns = parser.parse_args(check.argv)
    validate_parsed_serve_args(ns)
    engine_args = AsyncEngineArgs.from_cli_args(ns)
    notes = check_kv(str(engine_args.kv_cache_dtype), engine_args.attention_backend, allow=False,
                     gpu_spec=check.gpu_spec)
    if current_platform.is_cpu() and not check.gpu_spec and engine_args.kv_cache_memory_bytes is None:
        notes.append(CPU_KV_NOTE)
    return notes


def check_offline(check: ArmCheck) -> list[str]:
    """An offline arm's LLM keywords: EngineArgs field names, values as vLLM's CLI parses them, DP 1, built."""
    from vllm.engine.arg_utils import EngineArgs  # vllm: this runs in the child that imported it

    flags = {k: v for k, v in check.kwargs.items() if k != "model"}
    check_flag_names(parse_vllm_args(flags), engine_arg_names())
    check_offline_flags(flags)
    parser = raising_parser(EngineArgs.add_cli_args)
    argv = cli_flags({k: v for k, v in flags.items() if k in option_names(parser)})
    refuse_unknown(parser, argv, skip_negatives=True)  # offline False is a value, not a flag form
    engine_args = EngineArgs(**check.kwargs)
    return check_kv(str(engine_args.kv_cache_dtype), engine_args.attention_backend,
                    allow=check.allow_unsupported_kv_cache_dtype, gpu_spec=check.gpu_spec)


def check_plugin(check: ArmCheck) -> list[str]:
    """The qa_kv plugin can run the arm's kv spec in this vLLM (evals.engines.vllm.kv.plugin), and the
    static scales it names read (quant.scales.files: the hf engine's reader); a GPU spec's scales that are not on
    this machine are a note (they are read where the arm runs)."""
    from evals.engines.vllm.kv.emulate import load_scales  # torch: the scales are tensors

    why = unrecognised_vllm(dict(os.environ))
    if why is not None:
        raise Refused(f"kv = {{...}}: {why}")
    assert check.kv is not None  # callers check first
    spec = kv_spec_from_dict(dict(check.kv))
    if check.gpu_spec and spec.scales_file is not None and not spec.scales_file.exists():
        return [f"kv scales {str(spec.scales_file)!r} are not on this machine: read where the arm runs"]
    load_scales(spec)  # QuantError (a ValueError): one line
    return []


def run_check(check: ArmCheck) -> CheckOutcome:
    """One arm's check under its env; any refusal becomes the outcome's one-line error."""
    import huggingface_hub.constants as hub  # huggingface_hub: only in the check's child

    offline, hub.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE, False  # EngineArgs would look the model up offline
    try:
        with scoped_env(check.env):  # the arm's variables for its check, then restored
            check_env(check.env)
            notes = check_server(check) if check.kind == "server" else check_offline(check)
            if check.kv is not None:
                notes += check_plugin(check)
        return CheckOutcome(arm=check.arm, notes=notes)
    except (Refused, EngineError, ValueError, TypeError, KeyError) as exc:
        return CheckOutcome(arm=check.arm, error=first_line(exc))
    finally:
        hub.HF_HUB_OFFLINE = offline


def main(argv: list[str] | None = None) -> int:
    """`python -m evals.engines.vllm.check OUT`: checks (JSON list) on stdin, a CheckReport to OUT."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m evals.engines.vllm.check OUT < checks.json", file=sys.stderr)
        return 2
    checks = [ArmCheck.model_validate(c) for c in json.loads(sys.stdin.read())]
    try:
        import vllm  # vllm: only in the check's child
    except ImportError as exc:
        print(f"vllm is not importable here: {exc}", file=sys.stderr)
        return 3
    report = CheckReport(vllm=str(vllm.__version__), outcomes=[run_check(c) for c in checks])
    Path(args[0]).write_text(report.model_dump_json(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
