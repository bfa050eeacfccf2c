"""The KV caches for transformers models and what describes, perturbs and measures them.

Caches: the emulated quantized cache (`cache.make_cache`; built from layer, stream, qtensor, buffer and
rows), the plain growable cache of a baseline arm (`plain.make_plain_cache`) and the observing cache that
calibration and kv-inspect use (`observe.ObservingCache`). Around them: spec (KVQuantSpec, what an arm's
`kv` table says), shape (what a model's attention layers write), profiles and attention (what a real
engine stores and rounds beyond the cache), faults and fault_presets (fault injection), inspect and
inspect_report (kv-inspect and its kv_inspect.json), calibrate (static K/V scales observed on token chunks)
and scale_check (a model folder's scales against amax observed here). Import from the modules themselves."""
