"""Maintenance and study scripts (not installed): run from the repository root as `python -m scripts.<name>`
(the shell scripts setup.sh, test.sh and gpu_check.sh as `scripts/<name>.sh`)."""
