"""The `openai` engine: any OpenAI-compatible completions server (vLLM, SGLang, llama.cpp's server).

args.py: OpenAIArgs (pydantic only); client.py: HTTP, retries with seeded backoff, timeouts, the API
key; completions.py: the engine (generation, log-likelihood via echo, token log-probs) and `build`.
"""
