"""`qa invariance ALONE_RUN LOADED_RUN`: batch invariance of a run served under load against the same spec served
alone (qa.compare.batch_invariance), written into LOADED_RUN for `qa gate` and `qa report` to read.

Exits 0 when the file is written (the gate decides it: `qa gate LOADED_RUN`); 2 on bad input, as one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qa.cli.app import app
from qa.compare.batch_invariance import INVARIANCE_FILE, LoadArms, batch_invariance
from qa.errors import QAError
from qa.files.rundir import RunDir

ArmOpt = Annotated[str, typer.Option(help="Arm name in both runs' records/.")]


@app.command()
def invariance(
    alone: Annotated[Path, typer.Argument(help="Run directory of the spec served alone (load concurrency 1).")],
    loaded: Annotated[Path, typer.Argument(help="Run directory of the same spec under load (concurrency N).")],
    baseline: ArmOpt = "baseline",
    candidate: ArmOpt = "candidate",
) -> None:
    """Per arm, the items whose outcome changes between concurrency 1 and N; the candidate's change rate against
    the baseline's (paired). Writes LOADED/batch_invariance.json; `qa gate LOADED` then decides it."""
    if alone.resolve() == loaded.resolve():
        raise QAError(f"qa invariance: {alone} is given twice; pass the run served alone, then the one under load")
    a, b = RunDir(alone), RunDir(loaded)
    arms = LoadArms(baseline_alone=a.arm_records(baseline), baseline_loaded=b.arm_records(baseline),
                    candidate_alone=a.arm_records(candidate), candidate_loaded=b.arm_records(candidate))
    result = batch_invariance(arms, loaded)
    for row in result.tasks:
        print(f"{row.task}: changed between concurrency levels: baseline {row.baseline_changed}/{row.n}, "
              f"candidate {row.candidate_changed}/{row.n} (delta {row.delta:+.3f}, 90% CI "
              f"[{row.ci90.lower:+.3f}, {row.ci90.upper:+.3f}])")
    print(f"wrote {loaded / INVARIANCE_FILE}; decide it with: qa gate {loaded}")
