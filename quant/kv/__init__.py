"""The KV caches for transformers models: the emulated quantized cache (`kv.cache.make_cache`), the
plain growable cache of a baseline arm (`kv.plain.make_plain_cache`) and the observing cache that
calibration and kv-inspect use (`kv.observe.ObservingCache`). Import from the modules themselves."""
