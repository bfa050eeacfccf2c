"""Maintenance scripts (not installed): run as `python scripts/<name>.py`; their modules import as `scripts.*`."""
