"""accuracy-parity: is the optimized deployment as accurate as its baseline?

The Python API (`qa.api`): `run` a spec, `compare` two arms, `gate` a run under a policy, `report` it.
"""

from qa.api import compare, gate, report, run

__all__ = ["compare", "gate", "report", "run"]
