"""Files of a run directory and their typed models: what lies on disk (spec, policy, comparison, verdict, the resolved run)."""
