"""Pairing, statistics, gate policy and verdict, report rendering, run specs and the `qa` CLI."""
