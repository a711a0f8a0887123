"""Cost-model calibration for CAKE.

- `calibration.micro`: microbenchmarks written in CAKE IR (one module per family). Each declares the
  ArchSpec constant(s) it informs and how its measured time converts into a value.
- `calibration.fit`: direct conversion of measurements into constants, then a refinement of a few
  multiplicative group factors against measured times of real kernels (pure numpy).
- `calibration.variants`: the GEMM / softmax variant sets used by the refinement and by
  bench/rank_variants.py.
- `calibration.measure`: the GPU side (allocation, initialisation, CUDA-event timing, checks).
- `python -m calibration.run`: measure, fit and write calibration/data/<gpu>.json.

Nothing here imports a GPU library at module import time; `calibration.measure` does so inside
functions.
"""
