"""Pair two arms' records and build the comparison's estimates from them (numbers, no decisions)."""
