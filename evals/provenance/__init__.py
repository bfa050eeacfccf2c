"""What KV cache and scales an arm really ran with: the arm.json record (record), how each engine's is
found (engines), a server log's say (server_log), a model folder's scale fit kept between processes (scale_fits).
"""
