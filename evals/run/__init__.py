"""Running an arm: its config, the arm.json it writes and the runner (arm; the file's contract is
evals.records.arm_file), one task on one engine (runner), the sessions probe (sessions), the teacher-forced
reference pass (reference), resume checks, progress lines, items against the context window (context_fit),
seeded item selection (selection), a reused baseline (reuse).
"""
