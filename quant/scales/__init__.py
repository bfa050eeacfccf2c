"""K/V decode scales: calibration (calibrate), the scales files (files), export for vLLM and
compressed-tensors (export), each writer's conventions (conventions), the one reading of a model folder's
scales (folder) and the fit of scales against observed amax (check).
"""
