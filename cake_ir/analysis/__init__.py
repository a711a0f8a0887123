"""Analyses shared by the verifier, passes, cost model and lowering."""
