"""Running an arm: the arm.json contract and runner (arm), one task on one engine (runner), the sessions
probe (sessions), the teacher-forced reference pass (reference), resume checks, progress lines, items against
the context window (context_fit), seeded item selection (selection), a reused baseline (reuse).
"""
