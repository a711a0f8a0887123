"""Promotion: turn recurring evidence in the knowledge DB into reviewable plugin proposals.

One module per kind: rule.py (verifier rule), primitive.py (IR primitive), calibration.py (cost-model
constants), tactic.py (macro tactic). Each exposes `propose(store, cfg) -> list[Proposal]`; the
proposals are written out (git branch or knowledge/proposals/) by knowledge.proposals. Promotion runs
only between campaigns.
"""
