"""Data loading, tasks, engines (hf, vllm, openai-compatible), the runner that writes per-sample
records, and record import from lm-eval. Imports `quant`, never `qa`."""
