"""What the library accepts as arrays and how results come back.

- torch CUDA tensors: used in place (made contiguous and cast to fp16 on the GPU when needed); results
  are torch tensors on the same device, launched on torch's current stream.
- objects with `__cuda_array_interface__` (cupy, numba, ...) and gpu_backend DeviceArrays: used in
  place when fp16 and C-contiguous; results are DeviceArrays.
- numpy arrays: converted to fp16, copied to the GPU; results are copied back as numpy arrays.
torch is imported only when a torch tensor is passed (it is not a dependency).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

_CAI_DTYPES = {"<f2": "f16", "<f4": "f32", "<i4": "i32"}


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr") and hasattr(x, "is_cuda")


@dataclass
class Arg:
    """A device view (anything gpu_backend's runner launches with) plus how to return results."""
    view: Any          # torch tensor, DeviceArray or (ptr, shape)
    shape: tuple
    kind: str          # "torch" | "device" | "numpy"
    device: Any = None  # torch device for kind == "torch"
    owned: Any = None   # a DeviceArray this module allocated (freed by `release`)

    def reshaped(self, shape) -> Any:
        """The same memory seen with another (contiguous) shape."""
        shape = tuple(int(s) for s in shape)
        if self.kind == "torch":
            return self.view.reshape(shape)
        ptr = self.view.ptr if hasattr(self.view, "ptr") else self.view[0]
        return (int(ptr), list(shape))


def as_input(x, name: str, dtype: str = "f16") -> Arg:
    """A read-only kernel input of CAKE dtype `dtype` (only f16 is converted automatically)."""
    if _is_torch(x):
        import torch
        if not x.is_cuda:
            raise TypeError(f"{name}: a CPU torch tensor; pass a CUDA tensor or a numpy array")
        want = {"f16": torch.float16, "f32": torch.float32, "i32": torch.int32}[dtype]
        t = x.to(want).contiguous()
        return Arg(t, tuple(t.shape), "torch", t.device)
    if hasattr(x, "__cuda_array_interface__") or (hasattr(x, "ptr") and hasattr(x, "dtype")):
        if hasattr(x, "__cuda_array_interface__"):
            cai = x.__cuda_array_interface__
            got = _CAI_DTYPES.get(cai["typestr"], cai["typestr"])
            shape = tuple(cai["shape"])
            strides = cai.get("strides")
            ptr = cai["data"][0]
            if strides is not None and tuple(strides) != _c_strides(shape, np.dtype(cai["typestr"]).itemsize):
                raise TypeError(f"{name}: not C-contiguous (strides {strides})")
        else:
            got, shape, ptr = x.dtype, tuple(x.shape), x.ptr
        if got != dtype:
            raise TypeError(f"{name}: device array of dtype {got}; this operation reads {dtype} "
                            f"(convert it on the device first, or pass a torch tensor / numpy array)")
        return Arg((int(ptr), list(shape)), shape, "device")
    a = np.asarray(x)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{name}: numeric array expected, got dtype {a.dtype}")
    from gpu_backend.memory import DeviceArray
    dev = DeviceArray.from_host(a, dtype)
    return Arg(dev, tuple(a.shape), "numpy", owned=dev)


def is_f16(x) -> bool:
    """Whether an input (torch tensor, `__cuda_array_interface__` object, DeviceArray or numpy-convertible) holds
    fp16 values already."""
    if _is_torch(x):
        import torch
        return x.dtype == torch.float16
    if hasattr(x, "__cuda_array_interface__"):
        return _CAI_DTYPES.get(x.__cuda_array_interface__["typestr"]) == "f16"
    if hasattr(x, "ptr") and hasattr(x, "dtype"):
        return x.dtype == "f16"
    return np.asarray(x).dtype == np.float16


def device_of(x, default: int = 0) -> int:
    """The CUDA device ordinal a torch tensor lives on (`default` for anything else)."""
    if _is_torch(x) and x.is_cuda:
        return int(x.device.index or 0)
    return default


def _c_strides(shape, item):
    out, s = [], item
    for n in reversed(shape):
        out.append(s)
        s *= n
    return tuple(reversed(out))


def empty_like_kind(like: Arg, shape, dtype: str, scratch: bool = False) -> Arg:
    """An output buffer on the same kind of memory as `like`. scratch: a buffer the call keeps to itself (a
    DeviceArray is then owned, freed by `release` once the device is done with it; torch's allocator orders a
    tensor's reuse by stream)."""
    shape = tuple(int(s) for s in shape)
    if like.kind == "torch":
        import torch
        t = torch.empty(shape, dtype={"f16": torch.float16, "f32": torch.float32, "i32": torch.int32}[dtype],
                        device=like.device)
        return Arg(t, shape, "torch", like.device)
    from gpu_backend.memory import DeviceArray
    dev = DeviceArray.alloc(shape, dtype)
    return Arg(dev, shape, like.kind, owned=dev if like.kind == "numpy" or scratch else None)


def as_output(x, name: str, shape, dtype: str, like: Arg) -> Arg:
    """A caller's preallocated output (`out=`): written in place, so it must already be what the kernel
    writes: a contiguous CUDA torch tensor of that shape and dtype on the inputs' device."""
    shape = tuple(int(s) for s in shape)
    if not _is_torch(x) or like.kind != "torch":
        raise TypeError(f"{name}: out= takes CUDA torch tensors (with torch inputs)")
    import torch
    want = {"f16": torch.float16, "f32": torch.float32, "i32": torch.int32}[dtype]
    if tuple(x.shape) != shape or x.dtype != want or not x.is_contiguous() or x.device != like.device:
        raise ValueError(f"{name}: expected a contiguous {want} tensor of shape {list(shape)} on {like.device}, "
                         f"got {x.dtype} {list(x.shape)} on {x.device}"
                         + ("" if x.is_contiguous() else " (not contiguous)"))
    return Arg(x, shape, "torch", like.device)


def result(arg: Arg):
    """What the caller gets back: the torch tensor / DeviceArray, or a numpy copy."""
    if arg.kind == "numpy":
        from gpu_backend.memory import synchronize
        synchronize()
        out = arg.owned.download()
        return out.astype(np.int32) if arg.owned.dtype == "i32" else out.astype(np.float32)
    return arg.view


def reshape(obj, shape):
    """A result seen with another contiguous shape (torch tensor, DeviceArray or numpy array)."""
    if hasattr(obj, "reshape"):
        return obj.reshape(shape)
    from gpu_backend.memory import DeviceArray
    return DeviceArray(obj.ptr, tuple(shape), obj.dtype, obj.owned)


def release(*args: Optional[Arg]) -> None:
    for a in args:
        if a is not None and a.owned is not None:
            a.owned.free()
            a.owned = None


def stream_of(arg: Arg) -> int:
    """The stream a call launches on: torch's current stream on the tensor's device (read as the raw
    handle, no Stream object), else the legacy default stream."""
    if arg.kind == "torch":
        from .launch_plan import current_stream
        return current_stream(arg.device.index)
    return 0
