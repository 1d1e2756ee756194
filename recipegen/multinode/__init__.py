"""Lanes that span machines: vLLM's pipeline layer split, per-node commands, row-map slices."""
