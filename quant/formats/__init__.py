"""The number formats: bit-exact reference quantizers (minifloat, nvfp4, mxfp4, fp8, intq), their
torch.compile twins (compiled, nvfp4_fused, fp8_fused), llama.cpp's block formats, and the KVFormat registry
(registry; catalog: the format names, torch-free).
"""
