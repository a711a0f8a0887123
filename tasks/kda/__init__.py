"""Kimi Delta Attention (KDA) forward: prefill (`kda`) and one-token decode (`kda_decode`); the float64
references live in reference.py, the shape sets in shapes.py (docs/tasks-kda.md)."""
