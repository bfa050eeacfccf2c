"""accuracy-parity: is the optimized deployment as accurate as its baseline?

The Python API is `qa.api` (`from qa.api import run, compare, gate, report`): `run` a spec, `compare` two arms,
`gate` a run under a policy, `report` it. This package's own init imports nothing, so that the processes a run
starts (`python -m qa.pipeline.worker`) load only what they use.
"""
