"""`qa run`: resolve the spec once, check it, run each arm in its own process, then compare, gate and report."""
