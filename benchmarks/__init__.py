"""Study drivers that measure the toolkit side by side (speed, fidelity, items to a verdict); not installed.
Run each from the repository root as `python -m benchmarks.<name>`; what they write goes to
reports/benchmarks/<name>/ (reports/README.md)."""
