"""The C form of launch plans (cakelib/native_launch.py, cakelib/native/plan_launch.c) on the CPU: built
with the host compiler, it writes a call's pointers into the plan's cells and makes the plan's
cuLaunchKernel calls in order with the plan's arguments, stops at the first failing launch and reports
its CUresult; a planned kNN / k-means call through it launches what the general path launches. The
driver's entry point is a ctypes callback that records its arguments (tests/launch_doubles.py)."""
import ctypes
import shutil

import pytest
from launch_doubles import FakeTensor, RecordingDriver, install

from cakelib import native_launch

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                              reason="no host C compiler")

_U, _VP = ctypes.c_uint, ctypes.c_void_p
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, _VP, _U, _U, _U, _U, _U, _U, _U, _VP, _VP, _VP)
_SET_CTX = ctypes.CFUNCTYPE(ctypes.c_int, _VP)
CTX = 0xC0C0


class RawDriver:
    """cuCtxSetCurrent and cuLaunchKernel as C callbacks recording, in one event list, the context made
    current and each launch's raw arguments with the cells' values at that launch; `fail_at`: the launch
    that returns `code`; `ctx_code`: what cuCtxSetCurrent returns."""

    def __init__(self, cells, fail_at=None, code=719, ctx_code=0):
        self.events, self.cells, self.fail_at, self.code, self.ctx_code = [], cells, fail_at, code, ctx_code
        self.c = (_SET_CTX(self._set_ctx), _LAUNCH(self._launch))
        self.entries = tuple(ctypes.cast(e, ctypes.c_void_p).value for e in self.c)

    @property
    def calls(self):
        return [e for e in self.events if e[0] != "ctx"]

    def _set_ctx(self, ctx):
        self.events.append(("ctx", ctx))
        return self.ctx_code

    def _launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.events.append((fn, (gx, gy, gz), (bx, by, bz), smem, stream or 0, params, extra, tuple(self.cells)))
        return self.code if len(self.calls) - 1 == self.fail_at else 0


def _calls(n):
    """n cuLaunchKernel argument tuples as gpu_backend.module.launch_args makes them (plain ints here)."""
    return [(0x100 + i, 4 + i, 2, 1, 128, 1, 1, 1024 * i, 0x55, 0xA000 + 8 * i, 0) for i in range(n)]


@pytest.fixture
def lib(monkeypatch, tmp_path):
    monkeypatch.setattr(native_launch, "_LIB", None)
    monkeypatch.setattr(native_launch, "_cache_dir", lambda: tmp_path)
    lib = native_launch.library()
    assert lib is not None
    return lib


@needs_cc
def test_build_is_cached_by_source_hash(tmp_path):
    first = native_launch.build(native_launch.SOURCE, tmp_path)
    assert first is not None and first.exists()
    mtime = first.stat().st_mtime_ns
    assert native_launch.build(native_launch.SOURCE, tmp_path) == first
    assert first.stat().st_mtime_ns == mtime                     # reused, not rebuilt
    other = tmp_path / "other.c"
    other.write_text(native_launch.SOURCE.read_text() + "\n/* changed */\n")
    assert native_launch.build(other, tmp_path) not in (None, first)


def test_build_without_a_compiler_or_with_a_failing_one_gives_none(monkeypatch, tmp_path):
    bad = tmp_path / "bad.c"
    bad.write_text("this is not C\n")
    if shutil.which("cc") or shutil.which("gcc"):
        assert native_launch.build(bad, tmp_path) is None
    monkeypatch.setattr(native_launch.shutil, "which", lambda name: None)
    assert native_launch.build(native_launch.SOURCE, tmp_path) is None


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(native_launch, "_LIB", None)
    monkeypatch.setenv("CAKE_NATIVE_LAUNCH", "0")
    assert native_launch.library() is None
    assert native_launch.native_plan(CTX, _calls(1), (ctypes.c_uint64 * 1)()) is None


@needs_cc
def test_run_writes_the_cells_then_launches_each_kernel_in_order(lib, monkeypatch):
    cells = (ctypes.c_uint64 * 3)()
    drv = RawDriver(cells)
    monkeypatch.setattr(native_launch, "driver_entries", lambda: drv.entries)
    calls = _calls(3)
    plan = native_launch.native_plan(CTX, calls, cells)
    ptrs = (0x7000_0000_1000, 0xFFFF_FFFF_FFFF_0000, 0x42)      # full 64-bit pointers survive
    assert plan.run(plan.addr, *ptrs, *plan.pad) == 0
    assert [c[:6] for c in drv.calls] == [(f, (gx, gy, gz), (bx, by, bz), smem, st, p)
                                          for f, gx, gy, gz, bx, by, bz, smem, st, p, _ in calls]
    assert all(c[6] is None for c in drv.calls)                  # extra: NULL
    assert all(c[7] == ptrs for c in drv.calls)                  # the cells were written before any launch
    assert drv.events[0] == ("ctx", CTX)                         # the context made current first
    assert plan.fire(plan.addr) == 0 and len(drv.calls) == 6
    assert len(drv.events) == 7                                  # fire sets no context


@needs_cc
def test_a_failing_context_switch_launches_nothing(lib, monkeypatch):
    cells = (ctypes.c_uint64 * 1)()
    drv = RawDriver(cells, ctx_code=201)                         # CUDA_ERROR_INVALID_CONTEXT
    monkeypatch.setattr(native_launch, "driver_entries", lambda: drv.entries)
    plan = native_launch.native_plan(CTX, _calls(2), cells)
    assert plan.run(plan.addr, 9, *plan.pad) == 201 and drv.calls == []


@needs_cc
def test_the_first_failing_launch_stops_the_plan_and_is_reported(lib, monkeypatch):
    cells = (ctypes.c_uint64 * 1)()
    drv = RawDriver(cells, fail_at=1, code=719)
    monkeypatch.setattr(native_launch, "driver_entries", lambda: drv.entries)
    plan = native_launch.native_plan(CTX, _calls(3), cells)
    assert plan.run(plan.addr, 9, *plan.pad) == 719
    assert len(drv.calls) == 2                                   # the third launch was not made


@needs_cc
def test_planned_launch_raises_the_drivers_error_by_name(lib, monkeypatch):
    from cakelib.launch_plan import PlannedLaunch
    from gpu_backend.driver import CudaError
    cells = (ctypes.c_uint64 * 2)()
    drv = RawDriver(cells, fail_at=0, code=719)
    monkeypatch.setattr(native_launch, "driver_entries", lambda: drv.entries)
    planned = PlannedLaunch(_calls(2), cells, keep=None, ctx=CTX)
    assert planned.native is not None
    with pytest.raises(CudaError, match="CUDA_ERROR_LAUNCH_FAILED"):
        planned.run((1, 2))


def test_more_cells_than_run_takes_gets_no_c_form(monkeypatch):
    monkeypatch.setattr(native_launch, "driver_entries", lambda: (1, 1))
    assert native_launch.native_plan(CTX, _calls(1), (ctypes.c_uint64 * 5)()) is None


@pytest.fixture
def native_rt(monkeypatch, lib):
    runtime, torch = install(monkeypatch.setattr, monkeypatch.setitem, native=True)
    runtime.torch = torch
    return runtime


def _launched(rt, call):
    n = len(rt.rec.launches)
    res = call()
    return res, rt.rec.launches[n:]


@needs_cc
@pytest.mark.parametrize("Q, M", [(3, 50), (4096, 33)])
def test_planned_knn_through_c_launches_what_the_general_path_launches(native_rt, Q, M):
    from cakelib import fast_calls, knn
    rt, f16 = native_rt, native_rt.torch.float16
    xq, xb = FakeTensor((Q, 128), f16), FakeTensor((M, 128), f16)
    knn(xq, xb, 10)                                              # general path: plans the call
    plan = rt.plans[fast_calls._knn_key(xq, xb, 10, "l2", None, 5)]
    assert plan.launch.native is not None
    rt.rec.current = None
    xq2, xb2 = FakeTensor((Q, 128), f16), FakeTensor((M, 128), f16)
    before = rt.prepares
    (I, D), fast = _launched(rt, lambda: knn(xq2, xb2, 10))
    assert rt.prepares == before, "a planned call must not prepare"
    assert rt.rec.current == 0xC0                                # the runtime's context, made current in C
    rt.plans.clear()
    _, slow = _launched(rt, lambda: knn(xq2, xb2, 10, out=(I, D)))
    assert fast == slow and len(fast) >= 1

