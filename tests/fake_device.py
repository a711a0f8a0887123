"""A fake device for testing gpu_backend.evaluate's orchestration on the CPU.

`install(monkeypatch, kernel_fn)` replaces device memory, context, compile, load/launch and timing
with host-side stand-ins; `kernel_fn(call_index, tensors: dict[name -> FakeArray], scalars)` plays the
kernel, reading and writing the arrays' `.bits` (raw element bits, as on a device).
"""
import itertools

import numpy as np

from gpu_backend import memory
from gpu_backend.candidate import Compiled
from gpu_backend.runner import LaunchSpec, ScalarDecl, TensorDecl

_addr = itertools.count(0x7F0000000000, 1 << 24)


class FakeArray:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(int(s) for s in shape), dtype
        self.ptr = next(_addr)
        self.bits = np.zeros(self.shape, dtype=memory.BITS_DTYPE[dtype])

    def data_ptr(self):
        return self.ptr

    def upload(self, values):
        self.upload_bits(memory.to_bits(values, self.dtype))

    def upload_bits(self, bits):
        self.bits[...] = bits

    def download_bits(self):
        return self.bits.copy()

    def download(self):
        return memory.from_bits(self.bits, self.dtype)

    def poison(self, stream=0):
        pat = memory.POISON_BITS[self.dtype]
        self.bits[...] = memory.BITS_DTYPE[self.dtype](pat)

    def free(self):
        self.ptr = 0


def softmax_spec():
    return LaunchSpec("fake_softmax", b"", [{"name": "X", "kind": "ptr", "dtype": "bf16"},
                                            {"name": "Y", "kind": "ptr", "dtype": "bf16"},
                                            {"name": "M", "kind": "scalar", "dtype": "i32"}],
                      256, 0, ["M"], {"N": 4096}, {"X": TensorDecl("bf16", ["M", "N"]),
                                                   "Y": TensorDecl("bf16", ["M", "N"], access="write")},
                      {"M": ScalarDecl("i32", min=1)})


def softmax_bits(x_bits):
    x = memory.bf16_bits_to_f32(x_bits).astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return memory.f32_to_bf16_bits((e / e.sum(-1, keepdims=True)).astype(np.float32))


def install(monkeypatch, kernel_fn, spec=None, compiled_ok=True):
    import gpu_backend.driver as drv
    import gpu_backend.evaluate as ev
    import gpu_backend.runner as runner
    import gpu_backend.timing as timing

    calls = {"n": 0}
    monkeypatch.setattr(memory.DeviceArray, "alloc", classmethod(lambda cls, shape, dtype: FakeArray(shape, dtype)))
    monkeypatch.setattr(memory, "synchronize", lambda call="": None)
    monkeypatch.setattr(drv, "context", lambda ordinal=0: (0, 0))
    monkeypatch.setattr(drv, "properties", lambda ordinal=0: {"name": "FakeGPU", "cc": (9, 0), "l2_bytes": 1 << 20})
    spec = spec or softmax_spec()

    def fake_compile(candidate, arch, verify=True, use_cache=True):
        if not compiled_ok:
            return Compiled(False, "bad", diagnostics=[{"code": "E-X", "severity": "error", "node": "/roles/0",
                                                        "message": "nope"}], error_class="compile_error")
        return Compiled(True, "fake", spec, [], None, {"arch": arch})

    monkeypatch.setattr(ev, "compile_candidate", fake_compile)

    class FakeKernel:
        def __init__(self, spec):
            self.spec = spec

        @classmethod
        def from_spec(cls, spec, device=0):
            return cls(spec)

        def prepare(self, tensors, scalars):
            return (self.spec.grid_dims(scalars), None, (tensors, dict(scalars)))

        def launch_prepared(self, prepared, stream=0):
            tensors, scalars = prepared[2]
            calls["n"] += 1
            kernel_fn(calls["n"] - 1, tensors, scalars)

        def unload(self):
            pass

    monkeypatch.setattr(runner, "CompiledKernel", FakeKernel)

    class FakeFlusher:
        nbytes = 2 << 20

        def flush(self, stream=0):
            pass

    monkeypatch.setattr(timing.L2Flusher, "for_device", classmethod(lambda cls, device=0: FakeFlusher()))

    def fake_time(launch, *, warmup=3, reps=20, flusher=None, before_each=None, stream=0):
        for _ in range(warmup + reps):
            if before_each:
                before_each()
            launch()
        return timing.summarize([0.1 + 0.001 * i for i in range(reps)], warmup, flusher.nbytes if flusher else 0)

    monkeypatch.setattr(timing, "time_launches", fake_time)
    return calls
