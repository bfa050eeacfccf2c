"""Resolve a spec once: `resolve_run(spec, run_dir, ...) -> ResolvedRun` (qa.pipeline.resolved_run).

Everything a run names is looked up here and nowhere else: the policy file (with its path and text), each
task built once with its options, every item it reads and the seeded selection every arm runs (plus the
look sizes of a sequential policy), each model resolved once, each arm's engine arguments as its engine
receives them (trust_remote_code, the calibrated scales a static-scales candidate reads), the folder that
carries calibrated scales to a vLLM candidate (resolved once it is written), a local server's typed spec (its
`kv` spec checked here, once, against what vLLM + the qa_kv plugin can honour: evals.engines.vllm.kv.spec.
check_vllm_kv) and each worker's interpreter.
What cannot be found on this machine (a vLLM interpreter, a GPU spec's hub model) is kept as the arm's
`problem`: the dry run shows it, the preflight of a real run refuses it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from evals.engines import parse_engine_args
from evals.engines.args import EngineArgs
from evals.engines.hf.args import HFEngineArgs
from evals.engines.vllm.args import VllmEngineArgs
from evals.engines.vllm.kv.spec import check_vllm_kv
from evals.errors import EngineError, EvalError, ModelError
from evals.models.gguf import gguf_file
from evals.models.resolve import ResolvedModel, resolve_model
from evals.prompts.reasoning import DEFAULT_THINK_TAGS
from evals.run.selection import select_items
from evals.servers.interpreter import vllm_python
from evals.servers.spec import (
    LlamaCppServerSpec,
    ServerSpec,
    VllmServerSpec,
    check_cache_type,
    server_spec_to_json,
)
from evals.tasks import get_task, supports_chat
from evals.tasks.base import TaskOptions
from qa.files.policy import Policy, parse_policy, policy_path, policy_text
from qa.files.resolved_json import (
    ArmKind,
    ArmRecord,
    CalibrationRecord,
    PolicyRecord,
    ResolvedRecord,
    ServerRecord,
    TaskRecord,
    text_sha256,
)
from qa.files.rundir import RunDir
from qa.files.spec import FIXED_ROLES, ArmSpec, ChatSettings, RunSpec, TaskSpec
from qa.pipeline.resolved_run import OPTIONS, ResolvedArm, ResolvedPolicy, ResolvedRun, ResolvedTask
from qa.stats.sequential import Design, look_sizes
from quant.kv.spec import KVQuantSpec

VLLM_FP8_DTYPES = ("fp8", "fp8_e4m3")  # vLLM KV dtypes that store E4M3 and read per-layer k/v scales
PYTHON_SHOWN = "python"  # stands for a vLLM interpreter this machine lacks, in a dry run's command line


def read_policy(ref: str, relative_to: Path | None) -> ResolvedPolicy:
    """The policy a spec names, read and parsed once, with its file (absolute) and text."""
    path = policy_path(ref, relative_to)
    text = policy_text(path)
    source = str(path) if path is not None else "qa/policies/default.toml"
    return ResolvedPolicy(parse_policy(text, source), ref, path.resolve() if path is not None else None, text)


def resolve_task_options(t: TaskSpec, chat: ChatSettings | None = None) -> TaskOptions:
    """The evals task options of one spec task; chat settings the task leaves unset come from `chat`
    (the spec's [chat] table, which tasks that cannot chat, such as wikitext_kl, ignore). An unset
    fewshot_as_multiturn follows chat, as lm-eval's --apply_chat_template turns it on by default."""
    defaults = chat if chat is not None and supports_chat(t.name) else None

    def pick(name: str) -> Any:
        own = getattr(t, name)
        return own if own is not None or defaults is None else getattr(defaults, name)

    tags = pick("think_tags")
    chats = bool(pick("chat"))
    multiturn = pick("fewshot_as_multiturn")
    return TaskOptions(
        num_fewshot=t.num_fewshot, max_tokens=t.max_tokens, temperature=t.temperature, top_p=t.top_p,
        top_k=t.top_k, min_p=t.min_p, stop=tuple(t.stop) if t.stop is not None else None,
        chat=chats, system_prompt=pick("system_prompt"),
        fewshot_as_multiturn=chats if multiturn is None else bool(multiturn),
        chat_template_kwargs=dict(pick("chat_template_kwargs") or {}),
        think_tags=DEFAULT_THINK_TAGS if tags is None else (tuple(tags) if tags else None),  # type: ignore[arg-type]
        extra=dict(t.options), reference_signal=t.reference_signal)


def resolve_task(t: TaskSpec, spec: RunSpec, policy: Policy, data_dir: Path | None) -> ResolvedTask:
    """One task: built once, its items read once, its seeded selection and (sequential) look sizes."""
    options = resolve_task_options(t, spec.chat)
    task = get_task(t.name, options, spec.model)
    items = tuple(task.items(data_dir))
    selection = tuple(select_items(items, t.limit, spec.seed))
    tp = policy.for_task(t.name)
    sizes = look_sizes(Design(looks=tp.looks, alpha=tp.alpha, spending=tp.spending), len(selection)) if tp.looks else ()
    record = TaskRecord(name=t.name, options=OPTIONS.dump_python(options, mode="json"), limit=t.limit,
                        repeats=t.repeats, items_available=len(items), items=len(selection), look_sizes=list(sizes))
    first = task.request(items[0], repeat=0, seed=spec.seed) if items else None
    return ResolvedTask(record, t, options, task, items, selection, first, tp, t.name in policy.tasks)


def emulated_kv(arm: ArmSpec) -> KVQuantSpec | None:
    """The KV spec of an arm that runs the emulated quantized KV cache (hf engine, a format other than
    none), else None."""
    args = arm.engine_args
    if isinstance(args, HFEngineArgs) and args.kv is not None and args.kv.format != "none":
        return args.kv
    return None


def feeds_vllm(spec: RunSpec, name: str) -> bool:
    """Whether the spec's [calibration] feeds arm `name` as a vLLM model folder: a vllm candidate with an
    FP8 (E4M3) KV cache and no model of its own, in a spec that calibrates fp8_e4m3 scales."""
    arm = spec.arms[name]
    if spec.calibration is None or spec.calibration.format != "fp8_e4m3" or name not in spec.candidates:
        return False
    args = arm.engine_args
    return (arm.engine == "vllm" and arm.model is None and isinstance(args, VllmEngineArgs)
            and str(args.flags().get("kv_cache_dtype", "auto")) in VLLM_FP8_DTYPES)


def engine_args(spec: RunSpec, name: str, rd: RunDir) -> EngineArgs:
    """An arm's engine arguments as its engine receives them: trust_remote_code from the spec, the
    calibrated scales of a static-scales candidate (a server's base_url is added when it starts)."""
    arm = spec.arms[name]
    given = arm.given_args()
    if spec.trust_remote_code and arm.engine in ("hf", "vllm"):
        given.setdefault("trust_remote_code", True)  # off unless the spec says so
    kv = arm.engine_args.kv if isinstance(arm.engine_args, HFEngineArgs) else None
    if (kv is not None and kv.scales == "static" and kv.scales_file is None and "scales" not in given
            and spec.calibration is not None):  # a spec naming its own scales file or folder keeps it
        given["scales"] = str(rd.scales)
    return parse_engine_args(arm.engine, given)


def vllm_python_or_none() -> str | None:
    """The interpreter that runs vLLM, or None when this machine has none."""
    try:
        return vllm_python()
    except EngineError:
        return None


def resolve_server(spec: RunSpec, name: str, model: ResolvedModel | None, vllm: str | None) -> ServerSpec:
    """The typed server spec (evals.servers.spec) of an arm's `server` table (model files resolved, nothing started; a
    vLLM server run by `vllm`, PYTHON_SHOWN when there is none); the arm's `env` is the server's. EngineError for
    a `kv` spec vLLM + the qa_kv plugin cannot honour (the one check, evals.engines.vllm.kv.spec.check_vllm_kv)."""
    arm = spec.arms[name]
    server = arm.server
    assert server is not None  # callers check first
    if server.kind == "llamacpp":
        gguf = Path(server.gguf) if server.gguf else gguf_file(spec.arm_model(name))
        if not gguf.is_file():
            raise ModelError(f"arm {name}: server.gguf {str(gguf)!r} is not a file")
        return LlamaCppServerSpec(
            gguf=gguf, cache_type_k=check_cache_type(server.cache_type_k),
            cache_type_v=check_cache_type(server.cache_type_v), flash_attn=server.flash_attn,
            rotate_kv=server.rotate_kv, n_ctx=server.n_ctx, n_parallel=server.n_parallel, threads=server.threads,
            env=dict(arm.env))
    if server.kv is not None:
        check_vllm_kv(server.kv, str(server.args.get("kv_cache_dtype", "auto")), where=f"arm {name!r}: vllm server")
    folder = model.path if model is not None else None
    return VllmServerSpec(model=folder or Path(spec.arm_model(name)), args=dict(server.args),
                          python=vllm or PYTHON_SHOWN, env=dict(arm.env), kv=server.kv)


def _model(name: str, cache: dict[str, ResolvedModel | EvalError]) -> ResolvedModel | EvalError:
    if name not in cache:
        try:
            cache[name] = resolve_model(name)
        except EvalError as exc:
            cache[name] = exc
    return cache[name]


def resolve_arm(spec: RunSpec, name: str, rd: RunDir, models: dict[str, ResolvedModel | EvalError],
                vllm: str | None) -> ResolvedArm:
    """One arm (see the module doc); `models` caches each model resolved, `vllm` is the vLLM interpreter."""
    arm = spec.arms[name]
    kind: ArmKind = name if name in FIXED_ROLES else "candidate"  # type: ignore[assignment]
    out = ((rd.candidate(name).root.relative_to(rd.root).as_posix() if spec.per_candidate_dirs else ".")
           if kind == "candidate" else None)
    if arm.engine == "lmeval":
        assert arm.lmeval_dir is not None  # the spec validator guarantees it
        record = ArmRecord(name=name, kind=kind, engine="lmeval", model=spec.arm_model(name), load=spec.arm_model(name),
                           engine_args=None, runs=False, records=str(Path(arm.lmeval_dir).resolve()), out=out)
        return ResolvedArm(record, None, None, None, None)
    problems: list[str] = []
    found = _model(spec.arm_model(name), models)  # every engine's arm.json names the model's file hash
    model = found if isinstance(found, ResolvedModel) else None
    if isinstance(found, EvalError):
        problems.append(str(found))
    if model is not None and model.path is None and arm.server is not None and arm.server.kind == "vllm":
        problems.append(f"arm {name}: a vllm server needs a local model folder; {spec.arm_model(name)!r} is a hub id")
    uses_vllm = arm.engine == "vllm" or (arm.server is not None and arm.server.kind == "vllm")
    if uses_vllm and vllm is None:
        try:
            vllm_python()
        except EngineError as exc:
            problems.append(str(exc))
    args = engine_args(spec, name, rd)
    server = resolve_server(spec, name, model, vllm) if arm.server is not None else None
    load = str(rd.vllm_model) if feeds_vllm(spec, name) else spec.arm_model(name)
    loaded: ResolvedModel | EvalError | None = None
    if load != spec.arm_model(name) and (rd.vllm_model / "config.json").is_file():  # the calibration step wrote it
        loaded = _model(load, models)
    runs = not (name == "baseline" and arm.from_run is not None)
    server_record = None
    if server is not None and arm.server is not None:
        server_record = ServerRecord(kind=arm.server.kind, spec=server_spec_to_json(server),
                                     ready_timeout_s=arm.server.ready_timeout_s,
                                     log=rd.server_log(name).relative_to(rd.root).as_posix())
    record = ArmRecord(
        name=name, kind=kind, engine=arm.engine, model=spec.arm_model(name), load=load,
        engine_args=args.model_dump(mode="json", exclude_unset=True),
        server_settings=arm.server.model_dump(mode="json") if arm.server is not None else None,
        server=server_record, python=(vllm if arm.engine == "vllm" else sys.executable) if runs else None,
        env=dict(arm.env), runs=runs, records=rd.arm_records(name).relative_to(rd.root).as_posix(), out=out,
        reused_from=str(Path(arm.from_run).resolve()) if arm.from_run is not None else None)
    return ResolvedArm(record, args, server, emulated_kv(arm), model, "; ".join(problems) or None,
                       model_error=found if isinstance(found, EvalError) else None,
                       loaded=loaded if isinstance(loaded, ResolvedModel) else None)


def calibration_record(spec: RunSpec, rd: RunDir) -> CalibrationRecord | None:
    """The calibration step of the spec, run on the first static-scales candidate (else the first candidate)."""
    if spec.calibration is None:
        return None
    static = [n for n in spec.candidates if (kv := emulated_kv(spec.arms[n])) is not None and kv.scales == "static"]
    name = (static or spec.candidates)[0]
    args = spec.arms[name].engine_args
    device, dtype = (args.device, args.dtype) if isinstance(args, HFEngineArgs) else ("cpu", "float32")
    fed = any(feeds_vllm(spec, n) for n in spec.candidates)
    return CalibrationRecord(step=spec.calibration, arm=name, model=spec.arm_model(name), device=device, dtype=dtype,
                             scales=rd.scales.relative_to(rd.root).as_posix(),
                             vllm_model=rd.vllm_model.relative_to(rd.root).as_posix() if fed else None)


def resolve_run(spec: RunSpec, run_dir: Path, *, data_dir: Path | None, spec_dir: Path | None) -> ResolvedRun:
    """The spec resolved once into `run_dir`'s terms (reads the policy, every task's data and each model once;
    writes nothing). `spec_dir`: the folder a relative policy path is read from (after the working directory)."""
    rd = RunDir(run_dir)
    policy = read_policy(spec.policy, spec_dir)
    tasks = tuple(resolve_task(t, spec, policy.policy, data_dir) for t in spec.tasks)
    models: dict[str, ResolvedModel | EvalError] = {}
    vllm = vllm_python_or_none() if any(
        a.engine == "vllm" or (a.server is not None and a.server.kind == "vllm") for a in spec.arms.values()) else None
    arms = tuple(resolve_arm(spec, name, rd, models, vllm) for name in spec.arms)
    record = ResolvedRecord(
        name=spec.name, model=spec.model, seed=spec.seed, trust_remote_code=spec.trust_remote_code,
        data_dir=str(data_dir.resolve()) if data_dir is not None else None,
        policy=PolicyRecord(name=policy.policy.name, ref=spec.policy,
                            path=str(policy.path) if policy.path is not None else None, sha256=text_sha256(policy.text)),
        sequential=any(t.policy.looks for t in tasks), tasks=[t.record for t in tasks], arms=[a.record for a in arms],
        calibration=calibration_record(spec, rd))
    return ResolvedRun(spec, rd, record, policy, tasks, arms)
