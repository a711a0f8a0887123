"""The large-k kNN path (k up to 1024, any D up to 1024): its kernels verify and compile, the library's
domain and errors, the block-wide selection's logic in a CPU emulation (tests/cpu_emu), and on a GPU the
results against a float64 reference (bench/lib_grid.py knn_check semantics)."""
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cake_ir.compiler import compile_ir
from cake_ir.verifier import verify

ROOT = Path(__file__).resolve().parent.parent


def _builds():
    from tasks.knn.dist_tile import knn_dist_tile, knn_pad_rows, knn_row_norms
    from tasks.knn.select import knn_select
    out = [knn_dist_tile(dp, norms=n, bm=bm) for dp in (8, 64, 104, 768, 1024) for n in (False, True) for bm in (32, 128)]
    out += [knn_row_norms(dp) for dp in (8, 104, 1024)] + [knn_row_norms(128, "Xq", "R", "QN")]
    out += [knn_pad_rows(d) for d in (1, 100, 1023)]
    out += [knn_select(k, m, merge=mg) for k in (33, 64, 100, 1024) for m in ("l2", "ip") for mg in (False, True)]
    return out


def test_wgmma_tile_verifies_and_compiles():
    from tasks.knn.dist_tile import knn_dist_tile_wgmma
    for dp in (64, 128, 768, 1024):
        ir = knn_dist_tile_wgmma(dp)
        assert not [d.short() for d in verify(ir).diagnostics if d.severity != "note"], dp
        assert compile_ir(ir, arch="sm_90a").ok, dp
    with pytest.raises(ValueError):
        knn_dist_tile_wgmma(104)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_kernels_verify_and_compile(arch):
    for ir in _builds():
        errs = [d.short() for d in verify(ir).diagnostics if d.severity == "error"]
        assert not errs, (ir.name, errs)
    for ir in _builds()[::3]:   # NVRTC: a sample of each builder's forms (all of them: ~1 min of CPU)
        res = compile_ir(ir, arch=arch)
        assert res.ok, (ir.name, [d.short() for d in res.diagnostics])


def test_domain():
    from cakelib.variants import knn_large_k_supports
    ok = [dict(Q=1, M=100, k=100, D=1), dict(Q=10000, M=10**6, k=1024, D=1024), dict(Q=5, M=2000, k=33, D=768)]
    bad = [dict(Q=1, M=100, k=101, D=8), dict(Q=1, M=5000, k=1025, D=8), dict(Q=1, M=5000, k=64, D=1025),
           dict(Q=1, M=5000, k=0, D=8), dict(Q=1, M=(1 << 22) + 1, k=64, D=8)]
    assert all(knn_large_k_supports(s) for s in ok)
    assert not any(knn_large_k_supports(s) for s in bad)


def _path(Q, M, k, D, rerank=False):
    from cakelib.knn_search import _route
    return _route({"Q": Q, "M": M, "k": k, "D": D, "arch": "sm_90a"}, rerank)[0]


def test_dispatch_and_errors():
    """k past the register lists runs the large-k path; k <= 32 the fused kernels (the tables at D 64 / 128,
    the any-D variants elsewhere); a clear error outside every domain."""
    assert _path(100, 10**6, 64, 128) == "large_k"
    assert _path(100, 10**6, 1024, 100) == "large_k"
    assert _path(100, 10**6, 10, 128) == "fused"
    assert _path(100, 10**6, 10, 768) == "fused"
    with pytest.raises(ValueError, match="outside what the library supports"):
        _path(1, 10**6, 2000, 128)
    with pytest.raises(ValueError, match="outside what the library supports"):
        _path(1, 10**6, 64, 2048)
    with pytest.raises(ValueError, match="rerank"):
        _path(1, 10**6, 10, 100, rerank=True)


def test_plan_bounds():
    """Chunks fit the workspace and the grid; partial lists fit their workspace."""
    from cakelib.knn_large_k import CAND_WORDS, MAX_CHUNK, PAD, chunk_rows, segments
    from cakelib.variants import KNN_LARGE_WS_WORDS
    for Q in (1, 64, 1000, 10000, 10**6):
        for M in (100, 4096, 10**5, 10**6, 1 << 22):
            qc = chunk_rows(Q, M)
            np_ = -(-M // PAD) * PAD
            assert PAD <= qc <= MAX_CHUNK and qc * np_ <= max(KNN_LARGE_WS_WORDS, PAD * np_)
            for k in (1, 64, 1024):
                if k > M:
                    continue
                R = min(qc, Q)
                seg, sl = segments(R, M, k)
                assert seg >= 1 and (seg - 1) * sl < M <= seg * sl and sl % 4 == 0
                assert seg == 1 or R * seg * k <= CAND_WORDS


# ---------------------------------------------------------------- the selection's logic, emulated on the CPU
def _emu_binary(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    d = tmp_path_factory.mktemp("emu")
    src = (ROOT / "cake_ir" / "runtime" / "cake.cuh").read_text()
    body = src[src.index("// ---------------------------------------------------------------- row_select"):
               src.rindex("}  // namespace cake")]
    (d / "row_select_body.inc").write_text(body)
    exe = d / "emu"
    subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-I", str(d), "-o", str(exe),
                    str(ROOT / "tests" / "cpu_emu" / "row_select_emu.cpp")], check=True)
    return exe


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return _emu_binary(tmp_path_factory)


def _cases():
    rng = np.random.default_rng(0)
    n = 6000
    yield "spread", 1024, rng.normal(size=n).astype(np.float32), None, None
    yield "tail", 100, rng.normal(size=n + 3).astype(np.float32), None, rng.normal(size=n + 3).astype(np.float32)
    yield "clustered", 100, (100 + rng.normal(size=n) * 1e-3).astype(np.float32), None, None
    yield "ties", 1024, np.full(n, 1.5, np.float32), None, None                   # the tie-overflow path
    yield "few_values", 33, rng.integers(1, 4, size=n).astype(np.float32), None, None
    yield "short", 100, rng.normal(size=40).astype(np.float32), None, None        # n < k: padded
    yield "k1", 1, rng.normal(size=n).astype(np.float32), None, None
    idx = np.sort(rng.choice(10**6, size=3000, replace=False)).astype(np.int32)
    yield "src_idx", 1024, rng.integers(1, 50, size=3000).astype(np.float32), idx, None
    yield "bias", 100, rng.normal(size=n).astype(np.float32), None, rng.normal(size=n).astype(np.float32)
    # segments of CAKE_SEL_SAMPLE_MIN_N keys or more take the sample-first threshold (sel_by_sample)
    n2 = 40000
    yield "long_spread", 1024, rng.normal(size=n2).astype(np.float32), None, None
    yield "long_k33_bias", 33, rng.normal(size=n2).astype(np.float32), None, rng.normal(size=n2).astype(np.float32)
    yield "long_clustered", 100, (100 + rng.normal(size=n2) * 1e-3).astype(np.float32), None, None
    yield "long_ties", 1024, np.full(n2, 1.5, np.float32), None, None        # the gather overflows: radix path
    yield "long_few_values", 33, rng.integers(1, 4, size=n2).astype(np.float32), None, None
    fooled = (10 + rng.normal(size=n2)).astype(np.float32)   # the sampled keys (stride 19) alone are good:
    fooled[::n2 // 2048] = -5 + 0.1 * rng.normal(size=len(fooled[::n2 // 2048]))   # too few gathered, radix path
    yield "long_sample_fooled", 1024, fooled, None, None


@pytest.mark.parametrize("kind", ["min", "max"])
def test_row_select_emulated(emu, kind):
    lines, expect = [], []
    scale, rbias = (-2.0, 0.25)
    for i, (name, K, s, idx, cb) in enumerate(_cases()):
        n = len(s)
        lines.append(f"{int(kind == 'max')} {K} {n} {int(idx is not None)} {scale} {rbias} {int(cb is not None)} {i % 2}")
        lines.append(" ".join(repr(float(x)) for x in s))
        if idx is not None:
            lines.append(" ".join(map(str, idx)))
        if cb is not None:
            lines.append(" ".join(repr(float(x)) for x in cb))
        f = np.float32(scale) * s + np.float32(rbias)
        if cb is not None:
            f = f + cb
        ids = idx if idx is not None else 7 + np.arange(n)
        order = np.lexsort((ids, f if kind == "min" else -f))[:K]
        worst = 3.0e38 if kind == "min" else -3.0e38
        ev = np.full(K, worst, np.float32)
        ei = np.full(K, -1, np.int64)
        ev[:len(order)], ei[:len(order)] = f[order], ids[order]
        expect.append((name, ev, ei))
    out = subprocess.run([str(emu)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True,
                         timeout=600).stdout.split("\n")
    pos = 0
    for name, ev, ei in expect:
        got = [ln.split() for ln in out[pos:pos + len(ev)]]
        pos += len(ev)
        gv = np.array([float(a) for a, _ in got], np.float32)
        gi = np.array([int(b) for _, b in got])
        assert np.array_equal(gi, ei), (name, np.nonzero(gi != ei)[0][:5])
        assert np.array_equal(gv, ev), name


# ---------------------------------------------------------------- on a GPU
def _gpu():
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU and torch")
@pytest.mark.parametrize("k", [33, 100, 1024])
@pytest.mark.parametrize("D", [64, 100, 768])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_knn_large_k_on_gpu(k, D, metric):
    import torch
    import cakelib
    from bench.knn_topk_check import check_knn, make_inputs
    for Q, M in ((3, 5000), (300, 20000)):
        xq, xb = make_inputs(Q, M, D)
        I, Dist = cakelib.knn(xq, xb, k, metric)
        torch.cuda.synchronize()
        ok, why = check_knn(xq, xb, I, Dist, k, metric)
        assert ok, (Q, M, why)
    out = (torch.empty(Q, k, dtype=torch.int32, device="cuda"), torch.empty(Q, k, dtype=torch.float32, device="cuda"))
    I2, D2 = cakelib.knn(xq, xb, k, metric, out=out)
    assert I2.data_ptr() == out[0].data_ptr() and torch.equal(I2, I)


# ---------------------------------------------------------------- the orchestration, on a simulated device
class _Heap:
    """Fake device memory: allocations at distinct addresses, (ptr, shape) views resolved to numpy arrays."""

    def __init__(self):
        self.blocks, self.next = {}, 1 << 20

    def alloc(self, shape, dtype):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        ptr, self.next = self.next, self.next + ((n + 4095) // 4096 + 1) * 4096
        self.blocks[ptr] = np.zeros(n, np.uint8)
        return ptr

    def view(self, ptr, shape, dtype):
        base = max(b for b in self.blocks if b <= ptr)
        buf = self.blocks[base]
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        assert ptr - base + n <= len(buf), "view past its allocation"
        return buf[ptr - base: ptr - base + n].view(dtype).reshape(shape)


class _Buf:
    def __init__(self, heap, shape, dtype):
        self.ptr, self.shape, self.dtype = heap.alloc(shape, dtype), tuple(shape), dtype


_NP = {"f16": np.float16, "f32": np.float32, "i32": np.int32}


class _FakeRuntime:
    """rt.kernel / launch / workspace: checks each launch against the kernel's declared tensors, shapes and
    scalar facts (gpu_backend.runner's checks), then runs what the kernel computes in numpy."""

    def __init__(self, heap, arch="sm_90a"):
        self.heap, self.arch, self.ws, self.launches = heap, arch, {}, []

    def kernel(self, key, build):
        from gpu_backend.runner import LaunchSpec, scalar_decls, spec_from_kernel  # noqa: F401
        from types import SimpleNamespace
        ir = build(self.arch)
        res = SimpleNamespace(kernel_name=ir.name, cubin=b"", signature=[], smem_bytes=0)
        return ir, spec_from_kernel(ir, res)

    def workspace(self, name, shape, dtype, stream=0):
        key = (name, tuple(shape), dtype)
        if key not in self.ws:
            self.ws[key] = _Buf(self.heap, shape, _NP[dtype])
        return self.ws[key]

    def launch(self, kern, tensors, scalars, stream=0):
        from gpu_backend.runner import _ptr_shape
        ir, spec = kern
        assert set(tensors) == set(spec.tensors), (ir.name, set(tensors) ^ set(spec.tensors))
        shapes = {n: _ptr_shape(t)[1] for n, t in tensors.items()}
        assert spec.shape_problem(shapes, scalars) is None, (ir.name, spec.shape_problem(shapes, scalars))
        assert set(scalars) == set(spec.scalars), (ir.name, set(scalars) ^ set(spec.scalars))
        for n, d in spec.scalars.items():
            assert d.violation(scalars[n]) is None, (ir.name, n, d.violation(scalars[n]))
        grid = spec.grid_dims(scalars)
        assert all(g >= 1 for g in grid) and (len(grid) < 2 or grid[1] <= 65535), (ir.name, grid)
        arr = {n: self.heap.view(_ptr_shape(t)[0], shapes[n], _NP[spec.tensors[n].dtype]) for n, t in tensors.items()}
        self.launches.append(ir.name)
        _simulate(ir, arr, dict(spec.consts, **scalars), grid)


def _simulate(ir, a, env, grid):
    name = ir.name
    if name.startswith("knn_pad_rows"):
        a["XP"][:] = 0
        a["XP"][:, :env["D"]] = a["X"]
    elif "_sqnorms_" in name:
        src, dst = ("Xb", "XN") if "Xb" in a else ("Xq", "QN")
        x = a[src].astype(np.float32)
        a[dst][:] = 0
        a[dst][0, :x.shape[0]] = (x * x).sum(1)
    elif name.startswith("knn_dist"):
        S = a["S"]
        S[:] = 0
        S[:, :env["M"]] = a["Xq"].astype(np.float32) @ a["Xb"].astype(np.float32).T
        if "XN" in a:
            x = a["Xb"].astype(np.float32)
            a["XN"][:] = 0
            a["XN"][0, :x.shape[0]] = (x * x).sum(1)
    elif name.startswith("knn_select"):
        mx = "_ip_" in name
        k = env["KK"]
        for r in range(grid[1]):
            for s in range(grid[0]):
                if "merge" in name:
                    f, idx = a["CV"][r], a["CI"][r].astype(np.int64)
                else:
                    c0 = s * env["SL"]
                    n = max(min(env["SL"], env["M"] - c0), 0)
                    f = a["S"][r, c0:c0 + n]
                    if "XN" in a:
                        f = np.float32(-2.0) * f + a["QN"][0, r] + a["XN"][0, c0:c0 + n]
                    idx = c0 + np.arange(n)
                order = np.lexsort((idx, -f if mx else f))[:k]
                ov, oi = a["OV"][r, s * k:(s + 1) * k], a["OI"][r, s * k:(s + 1) * k]
                ov[:] = -3e38 if mx else 3e38
                oi[:] = -1
                ov[:len(order)], oi[:len(order)] = f[order], idx[order]
    else:
        raise AssertionError(f"no simulation of {name}")


@pytest.mark.parametrize("Q,M,D,k,metric", [(3, 9000, 100, 64, "l2"), (300, 5000, 64, 33, "ip"),
                                            (1, 20000, 8, 1024, "l2"), (2, 70, 1, 50, "ip"),
                                            (200, 5000, 64, 100, "l2")])
def test_orchestration_simulated(monkeypatch, Q, M, D, k, metric):
    """cakelib/knn_large_k.py's launches (chunks, segments, merges, views, scalars) against the kernels'
    declarations, with each kernel's result computed in numpy: the float64-checked answer comes back."""
    from types import SimpleNamespace
    import cakelib.knn_large_k as lk
    from cakelib import arrays
    heap = _Heap()
    monkeypatch.setattr(lk, "KNN_LARGE_WS_WORDS", 1 << 20)            # several query chunks at these sizes
    monkeypatch.setattr(lk, "CAND_WORDS", 1 << 21)
    monkeypatch.setattr(arrays, "empty_like_kind", lambda like, shape, dt, scratch=False: SimpleNamespace(
        view=(b := _Buf(heap, shape, _NP[dt])) and (b.ptr, list(shape)), shape=tuple(shape), owned=None))
    rng = np.random.default_rng(1)
    xq = rng.normal(size=(Q, D)).astype(np.float16)
    xb = rng.normal(size=(M, D)).astype(np.float16)
    xb[5] = xb[3]                                                     # an exact tie
    args = []
    for x in (xq, xb):
        b = _Buf(heap, x.shape, np.float16)
        heap.view(b.ptr, x.shape, np.float16)[:] = x
        args.append(SimpleNamespace(view=(b.ptr, list(x.shape)), shape=x.shape))
    I, Dist = (_Buf(heap, (Q, k), dt) for dt in (np.int32, np.float32))
    rt = _FakeRuntime(heap)
    lk.knn_large_k(rt, args[0], args[1], k, metric, SimpleNamespace(view=(I.ptr, [Q, k])),
                   SimpleNamespace(view=(Dist.ptr, [Q, k])), 0)
    gi, gd = heap.view(I.ptr, (Q, k), np.int32), heap.view(Dist.ptr, (Q, k), np.float32)
    q, b = xq.astype(np.float64), xb.astype(np.float64)
    ex = ((q[:, None, :] - b[None]) ** 2).sum(-1) if metric == "l2" else -(q @ b.T)
    kth = np.sort(ex, 1)[:, k - 1]
    got = np.take_along_axis(ex, gi.astype(np.int64), 1)
    assert (gi >= 0).all() and all(len(set(r)) == k for r in gi.tolist())
    assert (got <= kth[:, None] + 1e-3 * (1 + np.abs(kth[:, None]))).all()
    assert np.allclose(gd, got if metric == "l2" else -got, rtol=1e-4, atol=1e-2)
    assert any(n.startswith("knn_select_merge") for n in rt.launches) == (lk.segments(min(Q, lk.chunk_rows(Q, M)), M, k)[0] > 1)
