"""cakelib's launch plans (cakelib/launch_plan.py, cakelib/fast_calls.py) on the CPU: a repeat knn / kmeans
call launches exactly what the general path launches for the same tensors (kernel, grid, block, shared
memory, stream and every argument value), and a changed shape, dtype, stream or out= misses the plan.

The doubles (tests/launch_doubles.py) sit at the library's boundaries only: a minimal `torch` module and
the CUDA driver, whose cuLaunchKernel records the arguments it was given. Kernels are the real IR,
compiled by NVRTC. Each test runs with the plans launching through cuda.bindings and through their C form
(cakelib.native_launch)."""
import sys
import threading

import pytest
from launch_doubles import FakeTensor, install

from cakelib import native_launch
from cakelib import runtime as rt_mod

@pytest.fixture(params=["bindings", "native"])
def rt(request, monkeypatch):
    """The runtime with plans launching through cuda.bindings, or through their C form
    (cakelib.native_launch; skipped without a host C compiler)."""
    native = request.param == "native"
    if native and native_launch.library() is None:
        pytest.skip("no host C compiler: plans launch through cuda.bindings")
    runtime, torch = install(monkeypatch.setattr, monkeypatch.setitem, native=native)
    runtime.torch = torch
    return runtime


@pytest.fixture
def fake_torch(rt):
    return rt.torch


def _general_path_launches(rt, call):
    """What the general path launches for `call` (the plans dropped first; they are rebuilt by it)."""
    rt.plans.clear()
    before, n = rt.prepares, len(rt.rec.launches)
    call()
    assert rt.prepares > before
    return rt.rec.launches[n:]


def _planned_launches(rt, call):
    before, n = rt.prepares, len(rt.rec.launches)
    res = call()
    assert rt.prepares == before, "a planned call must not prepare"
    return res, rt.rec.launches[n:]


# the table's picks there: a split search + merge kernel (mma.sync), a wgmma Program with its norms kernel
@pytest.mark.parametrize("Q, M", [(3, 50), (4096, 33)])
def test_knn_repeat_call_launches_what_the_general_path_launches(rt, fake_torch, Q, M):
    from cakelib import knn
    f16 = fake_torch.float16
    xq, xb = FakeTensor((Q, 128), f16), FakeTensor((M, 128), f16)
    knn(xq, xb, 10)                                              # general path: plans the call
    xq2, xb2 = FakeTensor((Q, 128), f16), FakeTensor((M, 128), f16)
    rt.rec.current = None
    (I, D), fast = _planned_launches(rt, lambda: knn(xq2, xb2, 10))
    assert rt.rec.current == 0xC0                                # the runtime's context made current
    assert I.shape == (Q, 10) and I.dtype == fake_torch.int32 and D.dtype == fake_torch.float32
    fast_ptrs = {n: v for launch in fast for n, v in launch[5]}    # a Program: search + merge kernels
    assert fast_ptrs["Xq"] == xq2.ptr and fast_ptrs["Xb"] == xb2.ptr and fast_ptrs["I"] == I.ptr
    slow = _general_path_launches(rt, lambda: knn(xq2, xb2, 10, out=(I, D)))
    knn(xq2, xb2, 10, out=(I, D))                                # plans the out= form
    _, fast_out = _planned_launches(rt, lambda: knn(xq2, xb2, 10, out=(I, D)))
    assert fast == slow == fast_out
    assert all(launch[4] == 5 for launch in fast)               # torch's current stream


def test_knn_plan_misses_on_shape_dtype_stream_and_bad_out(rt, fake_torch):
    from cakelib import knn
    f16 = fake_torch.float16
    xq, xb = FakeTensor((3, 128), f16), FakeTensor((50, 128), f16)
    knn(xq, xb, 10)
    _planned_launches(rt, lambda: knn(xq, xb, 10))
    for call in (lambda: knn(FakeTensor((4, 128), f16), xb, 10),                 # shape
                 lambda: knn(xq, FakeTensor((50, 128), fake_torch.float32), 10),  # dtype
                 lambda: knn(xq, xb, 9), lambda: knn(xq, xb, 10, "ip")):         # k, metric
        before = rt.prepares
        call()
        assert rt.prepares > before
    fake_torch.current = 77                                                       # stream
    before, n = rt.prepares, len(rt.rec.launches)
    knn(xq, xb, 10)
    assert rt.prepares > before and {launch[4] for launch in rt.rec.launches[n:]} == {77}
    bad = (FakeTensor((3, 9), fake_torch.int32), FakeTensor((3, 9), fake_torch.float32))
    with pytest.raises(ValueError, match="out\\[0\\]"):                         # out= checks kept
        knn(xq, xb, 10, out=bad)
    with pytest.raises(ValueError, match="k = 60"):
        knn(xq, xb, 60)


@pytest.mark.parametrize("iters", [1, 3])
def test_kmeans_repeat_call_launches_what_the_general_path_launches(rt, fake_torch, iters):
    from cakelib import kmeans
    f16 = fake_torch.float16
    x, c = FakeTensor((1, 1024, 128), f16), FakeTensor((1, 16, 128), f16)
    kmeans(x, 16, iters, init=c)
    x2, c2 = FakeTensor((1, 1024, 128), f16), FakeTensor((1, 16, 128), f16)
    (C, A), fast = _planned_launches(rt, lambda: kmeans(x2, 16, iters, init=c2))
    assert C.shape == (1, 16, 128) and A.shape == (1, 1024)
    assert len(fast) == 2 * iters - 1
    slow = _general_path_launches(rt, lambda: kmeans(x2, 16, iters, init=c2, out=(C, A)))
    # the fp16 centroids between iterations: a buffer of the plan's own there, the call's own here
    assert _named_scratch(fast) == _named_scratch(slow)
    before = rt.prepares
    kmeans(x2, 16, iters + 1, init=c2)                           # iters is part of the plan
    assert rt.prepares > before


def _named_scratch(launches):
    """Launches with the cast's destination (the scratch the next iteration reads) named, not numbered."""
    scratch = [dict(launch[5])["Dst"] for launch in launches if launch[0].startswith("cast")]
    return [launch[:5] + (tuple((n, "C16" if v in scratch else v) for n, v in launch[5]),) for launch in launches]


def test_entry_points_launch_a_plan_without_the_general_entry(rt, fake_torch, monkeypatch):
    """cakelib.knn / cakelib.kmeans launch a repeat call's plan themselves (a small call's host time is
    microseconds: one frame fewer), options at their defaults included; a call with other options goes to the
    general entry, which raises what it raises."""
    import cakelib
    from cakelib import kmeans_lloyd, knn_search
    f16 = fake_torch.float16
    xq, xb = FakeTensor((3, 128), f16), FakeTensor((50, 128), f16)
    x, c = FakeTensor((1, 1024, 128), f16), FakeTensor((1, 16, 128), f16)
    cakelib.knn(xq, xb, 10)
    cakelib.kmeans(x, 16, 2, init=c)

    def general(*a, **kw):
        raise AssertionError("the general entry ran")
    monkeypatch.setitem(cakelib._OPS, "knn", general)
    monkeypatch.setitem(cakelib._OPS, "kmeans", general)
    I, _ = _planned_launches(rt, lambda: cakelib.knn(xq, xb, 10))[0]
    assert I.shape == (3, 10)
    C, _ = _planned_launches(rt, lambda: cakelib.kmeans(x, 16, 2, init=c))[0]
    assert C.shape == (1, 16, 128)
    _planned_launches(rt, lambda: cakelib.knn(xq, xb, 10, variant=None, device=None, rerank=False))
    _planned_launches(rt, lambda: cakelib.kmeans(x, 16, 2, init=c, seed=3, variant=None))
    for call in (lambda: cakelib.knn(xq, xb, 10, rerank=True), lambda: cakelib.knn(xq, xb, 10, device=0),
                 lambda: cakelib.kmeans(x, 16, 2, init=c, variant={"kind": "wide"})):
        with pytest.raises(AssertionError, match="general entry"):
            call()
    monkeypatch.setitem(cakelib._OPS, "knn", knn_search.knn)
    monkeypatch.setitem(cakelib._OPS, "kmeans", kmeans_lloyd.kmeans)
    with pytest.raises(TypeError, match="metirc"):                       # an unknown option is refused
        cakelib.knn(xq, xb, 10, metirc="ip")


def test_plans_are_dropped_with_the_workspaces(rt, fake_torch):
    from cakelib import knn
    xq, xb = FakeTensor((3, 128), fake_torch.float16), FakeTensor((50, 128), fake_torch.float16)
    knn(xq, xb, 10)
    assert rt.plans
    for s in range(100, 101 + rt_mod.MAX_STREAMS):
        fake_torch.current = s
        knn(xq, xb, 10)
    # past MAX_STREAMS the other streams' workspaces are freed, and the plans that pointed into them go
    assert {key[-1] for key in rt.plans} == set(rt._streams) == {99 + rt_mod.MAX_STREAMS, 100 + rt_mod.MAX_STREAMS}


def test_threads_repeating_one_call_launch_their_own_pointers(rt, fake_torch, monkeypatch):
    """Two threads repeating one call on one stream share its plan: every launch carries the pointers of
    the call that made it (binding and launching are one step), never a mix of two calls'."""
    from cakelib import knn
    f16 = fake_torch.float16
    knn(FakeTensor((3, 128), f16), FakeTensor((50, 128), f16), 10)
    monkeypatch.setattr(sys, "getswitchinterval", sys.getswitchinterval)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    calls, errs, n = set(), [], len(rt.rec.launches)

    def work():
        try:
            for _ in range(200):
                xq, xb = FakeTensor((3, 128), f16), FakeTensor((50, 128), f16)
                out = (FakeTensor((3, 10), fake_torch.int32), FakeTensor((3, 10), fake_torch.float32))
                calls.add((("Xq", xq.ptr), ("Xb", xb.ptr), ("I", out[0].ptr), ("Dist", out[1].ptr)))
                knn(xq, xb, 10, out=out)
        except Exception as e:  # noqa: BLE001
            errs.append(e)
    try:
        ts = [threading.Thread(target=work) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errs
    launched = [dict(launch[5]) for launch in rt.rec.launches[n:]]
    assert len(launched) >= 400
    for a in launched:          # each launch's per-call pointers are all one call's
        assert any(all(a.get(name, v) == v for name, v in c) for c in calls)
