"""The `openai` engine: any OpenAI-compatible server (vLLM, SGLang, llama.cpp's server).

args.py: OpenAIArgs (pydantic only); client.py: HTTP, retries with seeded backoff, timeouts, the API
key; completions.py: the engine (generation, log-likelihood via echo, token log-probs) and `build`;
chat.py: generation over /chat/completions (`api = "chat"`); sampling.py: the sampling keys each
kind of server honours; load.py, load_run.py, load_metrics.py: the `load` option (filler clients, the
server's /metrics).
"""
