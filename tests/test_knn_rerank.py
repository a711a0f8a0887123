"""Exact re-ranking of kNN candidates (tasks/knn/rerank.py, `cakelib.knn(..., rerank=True)`): the kernel
verifies and compiles for both targets with no GPU; on a GPU its results are the float64 top-k of the
candidates it was given, and the library's re-ranked distances are fp32-exact where the fused search's are not."""
import numpy as np
import pytest

from cake_ir.compiler import compile_ir, compile_kernel
from cake_ir.verifier import verify
from tasks.knn.rerank import knn_rerank, rerank_candidates


@pytest.mark.parametrize("kc,k,metric,d,dtype", [(20, 10, "l2", 128, "f32"), (32, 32, "ip", 64, "f16"),
                                                 (9, 1, "l2", 128, "f16"), (17, 9, "ip", 128, "f32")])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_rerank_verifies_and_compiles(kc, k, metric, d, dtype, arch):
    kern = knn_rerank(kc, k, metric, d, dtype, arch)
    res = verify(kern)
    assert res.ok and not [x for x in res.diagnostics if x.severity == "error"], [x.short() for x in res.diagnostics]
    r = compile_ir(kern, arch=arch)
    assert r.ok, [x.short() for x in r.diagnostics if x.severity == "error"]
    src = compile_kernel(kern, emit="cuda").cuda_source
    assert "__trap()" in src                       # a candidate index outside [0, M) traps, not a wild read
    term = next(ln for ln in src.splitlines() if "pr[cake_e] = " in ln)    # the per-element score term, in fp32
    assert "qr[cake_e]" in term and "xr[cake_e]" in term and (" - " in term) == (metric == "l2")
    assert ("cake::h2f(xr[cake_e])" in term) == (dtype == "f16")


def test_rerank_candidate_count_and_refusals():
    assert [rerank_candidates(k, 10**6) for k in (1, 4, 10, 16, 24, 32)] == [9, 12, 20, 32, 32, 32]
    assert rerank_candidates(10, 15) == 15                        # never more than the database
    with pytest.raises(ValueError, match="kc <= 32"):
        knn_rerank(33, 10)
    with pytest.raises(ValueError, match="k <= kc"):
        knn_rerank(8, 10)
    with pytest.raises(ValueError, match="metric"):
        knn_rerank(20, 10, metric="cos")


def _gpu():
    try:
        from gpu_backend.driver import device_count
        return device_count() > 0
    except Exception:
        return False


def _exact(Xq, Xb, metric):
    q, b = Xq.astype(np.float64), Xb.astype(np.float64)
    if metric == "ip":
        return q @ b.T
    return (q * q).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * q @ b.T


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_rerank_kernel_keeps_the_exact_best_of_its_candidates(metric, dtype):
    """Candidates given (a shuffled random subset per query, with duplicate rows for exact ties): the kernel
    returns their float64 top k, ties to the smaller index, with fp32 scores."""
    from cakelib.runtime import runtime
    from gpu_backend.memory import DeviceArray, synchronize
    rng = np.random.default_rng(7)
    Q, M, D, k, kc = 37, 3000, 128, 10, 20
    npt = np.float32 if dtype == "f32" else np.float16
    Xb = rng.standard_normal((M, D)).astype(npt)
    Xb[1500:1600] = Xb[100:200]                       # exact duplicates: ties broken by index
    Xq = rng.standard_normal((Q, D)).astype(npt)
    CI = np.stack([rng.permutation(M)[:kc] for _ in range(Q)]).astype(np.int32)
    CI[:, :5] = np.array([100, 1500, 101, 1501, 7])   # tied pairs in every query's candidates
    rt = runtime(0)
    kern = rt.kernel(("test_rerank", metric, dtype), lambda arch: knn_rerank(kc, k, metric, D, dtype, arch))
    bufs = {"Xq": DeviceArray.from_host(Xq, dtype), "Xb": DeviceArray.from_host(Xb, dtype),
            "CI": DeviceArray.from_host(CI, "i32"), "I": DeviceArray.alloc((Q, k), "i32"),
            "Dist": DeviceArray.alloc((Q, k), "f32")}
    rt.launch(kern, bufs, {"Q": Q, "M": M}, 0)
    synchronize()
    I, Dv = bufs["I"].download(), bufs["Dist"].download()
    ex = _exact(Xq, Xb, metric)
    for qi in range(Q):
        s = ex[qi, CI[qi]]
        order = sorted(range(kc), key=lambda j: ((s[j] if metric == "l2" else -s[j]), CI[qi, j]))[:k]
        want = CI[qi, order]
        assert list(I[qi]) == list(want), (qi, I[qi], want)
        np.testing.assert_allclose(Dv[qi], s[order], rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_library_rerank_is_fp32_exact_where_the_fused_search_is_not(metric):
    """fp32 inputs: the fused search reads them as fp16, so its distances carry fp16 rounding of the inputs
    (and l2 the cancellation of ||q||^2 + ||x||^2 - 2 q.x); re-ranked, they are the fp32 values to ~1e-5, the
    indices the float64 best (recall 1, ties allowed)."""
    from cakelib import knn
    rng = np.random.default_rng(11)
    Q, M, D, k = 64, 20000, 128, 10
    Xb = (rng.standard_normal((M, D)) + 3.0).astype(np.float32)     # offset: l2's cancellation matters
    Xq = (Xb[rng.choice(M, Q)] + 0.05 * rng.standard_normal((Q, D))).astype(np.float32)
    ex = _exact(Xq, Xb, metric)
    I0, D0 = knn(Xq, Xb, k, metric)
    I1, D1 = knn(Xq, Xb, k, metric, rerank=True)
    got0 = np.take_along_axis(ex, I0.astype(np.int64), 1)
    got1 = np.take_along_axis(ex, I1.astype(np.int64), 1)
    scale = np.abs(ex).max()
    err0 = np.abs(D0 - got0).max() / scale
    err1 = np.abs(D1 - got1).max() / scale
    assert err1 < 2e-6 and err1 * 10 < err0, (err0, err1)
    best = np.sort(ex, 1)[:, :k] if metric == "l2" else -np.sort(-ex, 1)[:, :k]
    tol = 1e-5 * scale
    assert np.all(np.abs(got1 - best) <= tol), np.abs(got1 - best).max()     # the true top k (up to ties)
    assert np.all(np.diff(D1, axis=1) >= 0) if metric == "l2" else np.all(np.diff(D1, axis=1) <= 0)


def test_rerank_reads_fp16_only_when_both_inputs_are_fp16():
    """cakelib.arrays.is_f16 decides the re-ranking's precision (fp16 inputs are read as they are, anything
    else through an exact fp32 copy)."""
    from cakelib import arrays
    from gpu_backend.memory import DeviceArray
    assert arrays.is_f16(np.zeros((2, 4), np.float16)) and not arrays.is_f16(np.zeros((2, 4), np.float32))
    assert not arrays.is_f16([[1.0, 2.0]])

    class Cai:   # a cupy-like device array
        def __init__(self, typestr):
            self.__cuda_array_interface__ = {"typestr": typestr, "shape": (2, 4), "data": (0, False), "version": 3}
    assert arrays.is_f16(Cai("<f2")) and not arrays.is_f16(Cai("<f4"))
    assert arrays.is_f16(DeviceArray(0, (2, 4), "f16", owned=False)) \
        and not arrays.is_f16(DeviceArray(0, (2, 4), "f32", owned=False))
