"""GPU backend on cuda-python (no torch): driver access, device memory, module load and launch, TMA
descriptors, timing, and sandboxed evaluation.

- driver.py      checked driver calls, primary context, device properties
- memory.py      DeviceArray (cuMemAlloc), H2D/D2H with numpy, bf16 on numpy, NaN poison patterns
- module.py      cubin load, argument packing, cuLaunchKernel
- tensormap.py   TMA descriptors from the driver's encoder
- runner.py      LaunchSpec + CompiledKernel: launch from device pointers and shapes
- timing.py      CUDA-event timing, warm-up, median/min/max, L2 flush
- candidate.py   IR or raw-CUDA candidates -> LaunchSpec (compile cache)
- checks.py      output checks: unwritten (poison), NaN/Inf, rel RMSE / max-abs
- errors.py      CUDA error -> error_class, sticky or not
- record.py      EvalRecord (stage, status, error_class, node, errors, timings, seed)
- evaluate.py    evaluate(candidate, task, gpu): compile, test, profile in this process
- worker.py      WorkerPool: one process per GPU, watchdog, restart after hangs and faults

Imports of cuda.bindings happen inside functions so importing this package is cheap and works on
machines without a GPU.
"""
