"""K/V decode scales as files and numbers, below the caches that read them: the scales files (files), export
for vLLM and compressed-tensors (export), each writer's conventions (conventions) and the one reading of a
model folder's scales (folder). Calibration and the check of a folder against a model run the model through a
cache, so they live above both, in quant.kv (calibrate, scale_check).
"""
