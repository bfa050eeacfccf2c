"""Models by name, folder or hub id: the named models shipped as GGUF inside PyPI wheels (named), their GGUF
file and the HF folder it is converted to (gguf), hub snapshots (hub), resolution of any of them to a folder
(resolve), a folder's config.json (config), loading with transformers (load), and the cache they live in
(cache). Import from the modules themselves.
"""
