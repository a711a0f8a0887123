"""Tasks: one package per task (reference, inputs, shapes, tolerance, baselines, seed IR programs)."""
