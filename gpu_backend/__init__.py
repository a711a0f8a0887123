"""GPU backend on cuda-python: module load, launch, TMA descriptors, device memory and timing.

Imports of cuda.bindings happen inside functions so importing this package is cheap and works on
machines without a GPU.
"""
