"""Verifier rules: one module per rule code (see cake_ir.verifier for the plugin contract).

`rules/proposed/` holds unreviewed proposals; the verifier never imports it. Modules whose name starts
with `_` are shared helpers, not rules. Fixtures: `rules/fixtures/<CODE>/{fail,pass}.json`.
"""
