"""What KV cache and scales an arm really ran with, below the engines that report it: the arm.json record
(record), a server log's own messages (server_log), a model folder's scale fit kept between processes
(scale_fits). How each engine's provenance is found is evals.engines.kv_provenance.
"""
