"""Numeric formats and KV-cache quantization: NVFP4 (+4over6), MXFP4, FP8, INT; the quantized
KV cache for transformers models; calibration; scale export. Imports neither `evals` nor `qa`."""
