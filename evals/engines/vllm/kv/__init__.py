"""The KV format emulated inside vLLM itself: a vLLM general plugin (`vllm.general_plugins` entry point
`qa_kv`) that passes every K and V an attention layer writes to its cache through quant/'s bit-exact
quantize -> dequantize, so vLLM's own scheduler, prefix cache, chunked prefill and parallelism run around
the emulated number format (docs/VLLM_KV_PLUGIN.md).

Modules: spec (what vLLM can honour of a kv spec, the environment that switches the plugin on: no torch,
no vllm), emulate (the per-layer rewrite: torch only), record (what the plugin rewrote, written at model
load by every process that loads the model and checked against their count, and the arm's provenance from
it), plugin (the vLLM side: the entry point, the patches, the model's attention layers counted and
checked; the only module that imports vllm), switch (the plugin on for one offline engine).
"""
