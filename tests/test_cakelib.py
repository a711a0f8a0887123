"""cakelib, the dispatching library: variant domains, dispatch with fallback, every table variant
verifies and compiles (CPU, NVRTC), and on a GPU (marked) knn / kmeans results against float64."""
from pathlib import Path

import numpy as np
import pytest

from cakelib import runtime as rt_mod
from cakelib.dispatch import Measurement, fit
from cakelib.variants import FALLBACK, NAMES, SUPPORTS, kmeans_supports, knn_supports

TABLES = Path(rt_mod.__file__).resolve().parent / "tables"


def test_knn_domain():
    fb = FALLBACK["knn"]
    assert knn_supports(fb, {"Q": 5, "M": 100, "k": 10, "D": 128})
    assert not knn_supports(fb, {"Q": 5, "M": 100, "k": 10, "D": 96})        # D is 64 or 128
    assert not knn_supports(fb, {"Q": 5, "M": 8, "k": 10, "D": 128})         # M < k
    split = {"bq": 16, "bn": 64, "split": 128, "stages": 4}
    assert knn_supports(split, {"Q": 16, "M": 10**6, "k": 16, "D": 128})
    assert knn_supports(split, {"Q": 16, "M": 10**6, "k": 32, "D": 128})      # split path up to k = 32
    assert not knn_supports(split, {"Q": 16, "M": 10**6, "k": 33, "D": 128})  # lists in registers: k <= 32
    assert knn_supports(split, {"Q": 1024, "M": 10**6, "k": 10, "D": 128})      # 1024 * 128 rows = WS_ROWS
    assert not knn_supports(split, {"Q": 1025, "M": 10**6, "k": 10, "D": 128})  # 65 tiles * 16 * 128 > workspace
    # a register cap (minb) spills 2-9 KB per thread at k = 32: outside the capped variants' domain there
    capped = {"bq": 128, "bn": 64, "split": 8, "stages": 4, "mma": "wgmma", "merge": "wide", "minb": 2}
    assert knn_supports(capped, {"Q": 4096, "M": 10**6, "k": 16, "D": 128, "arch": "sm_90a"})
    assert not knn_supports(capped, {"Q": 4096, "M": 10**6, "k": 32, "D": 128, "arch": "sm_90a"})
    assert knn_supports({**capped, "minb": 1}, {"Q": 4096, "M": 10**6, "k": 32, "D": 128, "arch": "sm_90a"})


def test_kmeans_domain():
    assert kmeans_supports({"kmax": 64, "bm": 64, "bn": 64, "ctas": 8}, {"B": 2, "N": 10, "K": 64, "D": 128})
    assert not kmeans_supports({"kmax": 64, "bm": 64, "bn": 64, "ctas": 8}, {"B": 2, "N": 10, "K": 65, "D": 128})


def test_choose_runs_the_per_call_form_the_sweep_times():
    """choose() turns the table's pick into its per-call form (per_call_form), the kernel the sweep times
    for that pick: kNN split picks at k > 1 get the merge kernel (and the sampled bound at M >= 256K for
    wgmma), unsplit picks and k = 1 stay as they are."""
    rt_mod._TABLES.clear()
    t = rt_mod.table("knn")
    seen = set()
    for Q, M, k in ((1, 100_000, 10), (1, 100_000, 1), (256, 1 << 20, 16), (32768, 32768, 8)):
        shape = {"Q": Q, "M": M, "k": k, "D": 128, "arch": "sm_90a"}
        _, picked = rt_mod._pick("knn", shape, t, SUPPORTS["knn"])
        name, p = rt_mod.choose("knn", shape)
        assert p == rt_mod.per_call_form("knn", picked, shape) and name == NAMES["knn"](p)
        seen.add((picked["split"] > 1 and k > 1, p != picked))
    assert seen == {(True, True), (False, False)}


def test_choose_without_table_uses_fallback(monkeypatch, tmp_path):
    monkeypatch.setattr(rt_mod, "TABLES", tmp_path)
    rt_mod._TABLES.clear()
    name, p = rt_mod.choose("knn", {"Q": 3, "M": 1000, "k": 10, "D": 128})
    assert p == FALLBACK["knn"] and name == NAMES["knn"](p)
    with pytest.raises(ValueError, match="outside what the library supports"):
        rt_mod.choose("knn", {"Q": 3, "M": 1000, "k": 10, "D": 96})
    with pytest.raises(ValueError, match="does not support"):
        rt_mod.choose("knn", {"Q": 3, "M": 1000, "k": 32, "D": 128}, variant={"bq": 16, "bn": 128, "split": 8})


def test_choose_follows_table_and_guards_its_pick(monkeypatch, tmp_path):
    small, big = {"bq": 16, "bn": 128, "split": 128, "stages": 4}, {"bq": 64, "bn": 64, "split": 1, "stages": 2}
    rows = []
    for Q in (1, 4, 16, 64, 1024, 4096):
        fast_split = Q <= 16
        rows += [Measurement({"Q": Q, "M": 1 << 20, "k": 10}, NAMES["knn"](small), 1.0 if fast_split else 9.0, True),
                 Measurement({"Q": Q, "M": 1 << 20, "k": 10}, NAMES["knn"](big), 5.0, True)]
    t = fit("knn", rows, ["log2_Q", "log2_M", "k"], {NAMES["knn"](v): v for v in (small, big)},
            NAMES["knn"](big), min_leaf=1)
    t.save(tmp_path / "knn.json")
    monkeypatch.setattr(rt_mod, "TABLES", tmp_path)
    rt_mod._TABLES.clear()
    assert rt_mod.choose("knn", {"Q": 8, "M": 1 << 20, "k": 10, "D": 128})[1] == small
    assert rt_mod.choose("knn", {"Q": 2048, "M": 1 << 20, "k": 10, "D": 128})[1] == big
    # the table prefers the split variant for Q = 8, but its registers do not fit k = 32 (E-RES-05)
    assert rt_mod.choose("knn", {"Q": 8, "M": 1 << 20, "k": 32, "D": 128})[1] == big
    rt_mod._TABLES.clear()


def test_small_databases_use_their_regions_table(monkeypatch, tmp_path):
    """M < KNN_SMALL_M picks from tables/knn_small.json where one exists, the main table elsewhere and
    while the region has none."""
    from cakelib.variants import KNN_SMALL_M
    a, b = {"bq": 64, "bn": 64, "split": 1, "stages": 2}, {"bq": 32, "bn": 64, "split": 1, "stages": 2, "norms": "global"}
    vs = {NAMES["knn"](v): v for v in (a, b)}
    for name, best, M in (("knn", a, 1 << 20), ("knn_small", b, 1000)):
        rows = [Measurement({"Q": Q, "M": M, "k": 10}, NAMES["knn"](v), 1.0 if v == best else 2.0, True)
                for Q in (1, 64, 4096) for v in (a, b)]
        fit("knn", rows, ["log2_Q", "log2_M", "k"], vs, NAMES["knn"](a), min_leaf=1).save(tmp_path / f"{name}.json")
        if name == "knn":
            monkeypatch.setattr(rt_mod, "TABLES", tmp_path)
            rt_mod._TABLES.clear()
            assert rt_mod.choose("knn", {"Q": 64, "M": 1000, "k": 10, "D": 128})[1] == a   # no region table yet
    rt_mod._TABLES.clear()
    rt_mod._CHOICES.clear()
    assert rt_mod.choose("knn", {"Q": 64, "M": KNN_SMALL_M - 1, "k": 10, "D": 128})[1] == b
    assert rt_mod.choose("knn", {"Q": 64, "M": KNN_SMALL_M, "k": 10, "D": 128})[1] == a
    rt_mod._TABLES.clear()


def _table_variants():
    """(op, name, params) of every variant a committed table can pick, and (kNN) every form the split
    path's per-call options turn a pick into (the merge kernel, the sampled bound: at k = 10, M = 100K and 1M)."""
    from cakelib.dispatch import DispatchTable
    from cakelib.variants import knn_name, knn_split_options
    out = []
    for path in sorted(TABLES.glob("*.json")):
        t = DispatchTable.load(path)
        out += [(t.op, name, t.variants[name]) for name in t.reachable()]
    tuned = {}
    for op, _, p in out:
        for M in (100_000, 1 << 20):
            q = knn_split_options(p, {"Q": 64, "M": M, "k": 10}) if op == "knn" else p
            if q is not p:
                tuned[knn_name(q)] = q
    return out + [("knn", n, q) for n, q in sorted(tuned.items())]


def test_committed_tables_load_and_reference_known_variants():
    from cakelib.dispatch import DispatchTable
    for path in sorted(TABLES.glob("*.json")):
        t = DispatchTable.load(path)
        assert t.op in SUPPORTS
        for name, p in t.variants.items():
            assert NAMES[t.op](p) == name, f"{path.name}: variant {name} has params {p}"


@pytest.mark.parametrize("op,name,p", _table_variants() or [pytest.param(None, None, None, marks=pytest.mark.skip(
    reason="no dispatch tables committed"))])
def test_table_variants_compile_for_sm90a(op, name, p):
    """Every variant a committed table can pick verifies and compiles for the H200 (k = 10, l2)."""
    from cake_ir.compiler import compile_ir
    from cakelib.variants import kmeans_kernel, knn_kernel
    ir = knn_kernel(p, 10, "l2", 128, "sm_90a") if op == "knn" else kmeans_kernel(p, "sm_90a")
    res = compile_ir(ir, arch="sm_90a")   # knn norms "global" is a Program
    assert res.ok, [d.short() for d in res.diagnostics if d.severity == "error"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_kmeans_mma_update_variants_compile(arch):
    """The sweep's tensor-core-update variants verify and compile (k256 and 128-point tiles of k128 need
    sm_90a's smem), and their update has no shared-memory atomic on the sums: only the counts keep
    red.shared."""
    from cake_ir.compiler import compile_kernel
    from cakelib.variants import kmeans_kernel
    from tasks.kmeans.programs import held_blocks
    from tasks.kmeans.wgmma import wgmma_held_blocks
    mma = [p for p in _lib_grid().kmeans_variants() if p.get("update") == "mma"]
    assert len(mma) >= 6
    for p in mma:
        if p.get("mma") == "wgmma" and arch != "sm_90a":
            continue                                       # sm_90a only (tests/test_kmeans_wgmma.py)
        r = compile_kernel(kmeans_kernel(p, arch), arch=arch)
        errs = [d.code for d in r.diagnostics if d.severity == "error"]
        if arch == "sm_80" and errs == ["E-RES-01"] and (p["kmax"] == 256 or p["bm"] == 128):
            continue                                       # 170-228 KB of smem: Hopper's 227 KB, not Ampere's 163
        assert r.ok, (p, [d.short() for d in r.diagnostics if d.severity == "error"])
        body = r.cuda_source.split("__global__")[-1]          # the kernel, not the runtime header
        # 8 n-tiles x urows / 16 m-tiles per 16 points, per accumulator block a warp holds (sums "regs": uacc0, ..)
        if p.get("sums") == "wgmma":     # per 16 points, each held 64-cluster block x 2 atoms of dims on wgmma
            held = wgmma_held_blocks(p["kmax"], p["bm"])
            n = p.get("update_n", 64)
            # twice: whole point tiles and a batch's last (wgmma.update_wgmma)
            assert body.count(f"cake_wgmma_rs_m64n{n}k16_f16_t1(&S") == 2 * p["bm"] // 16 * held * 128 // n, p
            assert "mma_16816_f16(&uacc" not in body, p
            continue
        held = held_blocks(p["kmax"], 128, p["bm"] // 16, p.get("urows", 16)) if p.get("sums") == "regs" else 1
        assert body.count("cake::mma_16816_f16(&uacc") == 8 * p.get("urows", 16) // 16 * (p["bm"] // 16) * held, p
        adds = [ln for ln in body.splitlines() if "red_add_shared" in ln]
        assert len(adds) == 2 and all(", 1.0f);" in ln for ln in adds), (p, adds)   # the counts of a lane's 2 rows


def _lib_grid():
    """bench/lib_grid.py (a script folder, not a package): the sweep's variants and the grid's shapes."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import lib_grid
    return lib_grid


def test_cast_kernel_compiles():
    from cake_ir.compiler import compile_kernel
    from cakelib.cast import cast_f32_f16
    for arch in ("sm_80", "sm_90a"):
        assert compile_kernel(cast_f32_f16(), arch=arch).ok


# ------------------------------------------------------------------ GPU
def _gpu():
    from gpu_backend.driver import gpu_available
    return gpu_available()




@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("Q,M,k,variant", [(3, 5000, 10, None),
                                           (37, 20000, 16, {"bq": 16, "bn": 32, "split": 8, "stages": 4}),
                                           (130, 4099, 10, {"bq": 64, "bn": 64, "split": 1, "stages": 2}),
                                           (5, 777, 1, {"bq": 32, "bn": 64, "split": 32, "stages": 3}),
                                           (64, 100000, 10, {"bq": 16, "bn": 32, "split": 512, "stages": 4}),
                                           (64, 100001, 10, {"bq": 16, "bn": 32, "split": 512, "stages": 4,
                                                             "norms": "global"}),
                                           (130, 4099, 10, {"bq": 64, "bn": 64, "split": 1, "stages": 2,
                                                            "norms": "global", "minb": 3})])
def test_knn_numpy_matches_float64(Q, M, k, variant):
    from cakelib import knn
    from tasks.knn.task import TASK
    shape = {"Q": Q, "M": M}
    inp = TASK.make_inputs(shape, seed=3)
    I, Dv = knn(inp["Xq"], inp["Xb"], k, variant=variant)
    assert I.shape == (Q, k) and Dv.shape == (Q, k)
    task = type(TASK)()
    task.k = k
    refs = task.reference(inp, shape)
    checks = task.check({"I": I, "Dist": Dv}, refs, inp, shape)
    assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,N,K,variant", [
    (1, 3000, 7, None), (3, 4099, 100, {"kind": "fused", "kmax": 128, "bm": 64, "bn": 64, "ctas": 4}),
    (2, 5000, 200, {"kind": "fused", "kmax": 256, "bm": 32, "bn": 64, "ctas": 66}),
    (5, 20000, 50, {"kind": "resident", "kmax": 64, "bm": 64, "bn": 64, "ctas": 33}),
    (2, 70000, 256, {"kind": "resident", "kmax": 256, "bm": 32, "bn": 64, "ctas": 132}),
    (4, 999, 100, {"kind": "resident", "kmax": 128, "bm": 32, "bn": 64, "ctas": 264}),
    # the tensor-core update: ragged tiles at the end of each batch (the next batch's rows masked), K not a
    # multiple of 16, one and several CTAs per batch
    (3, 4099, 100, {"kind": "resident", "kmax": 128, "bm": 64, "bn": 64, "ctas": 33, "big": 16, "update": "mma"}),
    (2, 70001, 250, {"kind": "fused", "kmax": 256, "bm": 64, "bn": 64, "ctas": 132, "update": "mma"}),
    (4, 999, 7, {"kind": "resident", "kmax": 32, "bm": 64, "bn": 64, "ctas": 264, "big": 8, "update": "mma"}),
    (2, 5000, 256, {"kind": "resident", "kmax": 256, "bm": 32, "bn": 64, "ctas": 132, "big": 8, "update": "mma"}),
    # 8 warps (the finish by warpgroup 0 on a named barrier), 32 clusters per accumulator block
    (3, 4099, 100, {"kind": "resident", "kmax": 128, "bm": 128, "bn": 64, "ctas": 33, "big": 8, "update": "mma",
                    "urows": 32}),
    (2, 70001, 250, {"kind": "fused", "kmax": 256, "bm": 128, "bn": 64, "ctas": 132, "update": "mma"}),
    # the centroid norms once per CTA (K not a multiple of the centroid tile: the next batch's rows)
    (3, 9999, 170, {"kind": "fused", "kmax": 256, "bm": 128, "bn": 64, "ctas": 33, "update": "mma", "urows": 32,
                    "norms": "once"}),
    # the next point tile prefetched (several point tiles per CTA; K below, at and past a centroid tile)
    (2, 70001, 250, {"kind": "fused", "kmax": 256, "bm": 64, "bn": 64, "ctas": 132, "update": "mma", "norms": "once",
                     "xstages": 2}),
    (1, 100003, 64, {"kind": "fused", "kmax": 256, "bm": 64, "bn": 64, "ctas": 33, "update": "mma", "urows": 32,
                     "norms": "once", "xstages": 2}),
    (3, 20001, 30, {"kind": "fused", "kmax": 128, "bm": 64, "bn": 64, "ctas": 16, "norms": "once", "xstages": 2})])
def test_kmeans_one_step_matches_float64(B, N, K, variant):
    from cakelib import kmeans
    from tasks.kmeans.task import TASK
    shape = {"B": B, "N": N, "K": K}
    inp = TASK.make_inputs(shape, seed=5)
    X = inp["X"].reshape(B, N, 128)
    C0 = inp["C"].reshape(B, K, 128)
    Cn, A = kmeans(X, K, 1, init=C0, variant=variant)
    assert Cn.shape == (B, K, 128) and A.shape == (B, N)
    checks = TASK.check({"A": A, "Cnew": Cn.reshape(B * K, 128)}, TASK.reference(inp, shape), inp, shape)
    assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_kmeans_ten_iterations_decrease_inertia():
    from cakelib import kmeans
    from tasks.kmeans.task import TASK, assign_reference
    inp = TASK.make_inputs({"B": 1, "N": 8000, "K": 50}, seed=9)
    X = inp["X"]
    c1, _ = kmeans(X, 50, 1, init=inp["C"])
    c10, a10 = kmeans(X, 50, 10, init=inp["C"])
    i1 = assign_reference(X, c1)[1].min(1).sum()
    i10 = assign_reference(X, c10)[1].min(1).sum()
    assert np.isfinite(c10).all() and i10 <= i1 * (1 + 1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_kmeans_writes_caller_outputs_in_place():
    """out=: one Lloyd step into the caller's poisoned tensors (returned as they are), checked against
    float64; with iterations the last step's centroids land there too."""
    torch = pytest.importorskip("torch")
    from cakelib import kmeans
    from tasks.kmeans.task import TASK
    B, N, K = 2, 5000, 40
    shape = {"B": B, "N": N, "K": K}
    inp = TASK.make_inputs(shape, seed=6)
    X = torch.as_tensor(inp["X"].reshape(B, N, 128), device="cuda")
    C0 = torch.as_tensor(inp["C"].reshape(B, K, 128), device="cuda")
    Cp = torch.full((B, K, 128), float("nan"), device="cuda")
    Ap = torch.full((B, N), -7, dtype=torch.int32, device="cuda")
    Cn, A = kmeans(X, K, 1, init=C0, out=(Cp, Ap))
    assert Cn.data_ptr() == Cp.data_ptr() and A.data_ptr() == Ap.data_ptr()
    checks = TASK.check({"A": A.cpu().numpy(), "Cnew": Cn.reshape(B * K, 128).cpu().numpy()},
                        TASK.reference(inp, shape), inp, shape)
    assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]
    C3, _ = kmeans(X, K, 3, init=C0, out=(Cp, Ap))
    assert C3.data_ptr() == Cp.data_ptr() and torch.isfinite(C3).all()
    with pytest.raises(ValueError, match="shape"):
        kmeans(X, K, 1, init=C0, out=(Cp[:, :5], Ap))


# ------------------------------------------------------------------ CPU: arrays and the benchmark's grid
def test_arrays_reject_what_they_cannot_launch():
    from cakelib import arrays

    class FakeCai:   # a cupy-like device array of the wrong dtype, then a strided one
        def __init__(self, typestr, strides=None):
            self.__cuda_array_interface__ = {"data": (1234, False), "shape": (4, 8), "typestr": typestr,
                                             "strides": strides, "version": 3}
    with pytest.raises(TypeError, match="dtype f32; this operation reads f16"):
        arrays.as_input(FakeCai("<f4"), "x")
    with pytest.raises(TypeError, match="not C-contiguous"):
        arrays.as_input(FakeCai("<f2", strides=(2, 8)), "x")
    a = arrays.as_input(FakeCai("<f2"), "x")           # in place: pointer and shape, no copy
    assert a.kind == "device" and a.view == (1234, [4, 8]) and a.reshaped((32,)) == (1234, [32])
    with pytest.raises(TypeError, match="numeric array expected"):
        arrays.as_input(np.array(["a", "b"]), "x")


def test_benchmark_grid_covers_400_shapes_in_the_supported_domain():
    lib_grid = _lib_grid()
    summarize = lib_grid.summarize
    kg, ng = lib_grid.kmeans_grid(), lib_grid.knn_grid()
    assert len(kg) + len(ng) >= 400
    for g in (kg, ng):
        assert len({tuple(sorted(s.items())) for s in g}) == len(g)   # no shape counted twice
    for op, grid in (("kmeans", kg), ("knn", ng)):   # a table pick or the fallback runs every shape
        for s in grid:
            shape = {**s, "D": 128}
            name, p = rt_mod.choose(op, shape)
            assert SUPPORTS[op](p, shape) and name == NAMES[op](p), (op, s, name)
    rows = [{"shape": {"Q": 1}, "ok": True, "speedup": 2.0, "best_baseline": "a"},
            {"shape": {"Q": 2}, "ok": True, "speedup": 0.5, "best_baseline": "b"},
            {"shape": {"Q": 3}, "ok": False, "why": "wrong"}]
    s = summarize(rows)
    assert s["geomean_speedup"] == pytest.approx(1.0) and s["worst_speedup"] == 0.5 and s["worst_shape"] == {"Q": 2}
    assert s["correct"] == 2 and s["slower_than_0.95"] == 1 and s["timed"] == 2


def test_sweep_probe_isolates_a_variant_that_kills_its_process():
    """bench/lib_grid.py probe: a child checks the variants in order; the parent reads its output. A
    variant the child died on (an illegal address poisons the CUDA context of the whole sweep) and the
    ones that failed their check are left out; a new child resumes after the dead one; a child that
    dies at start-up makes no progress (the caller stops probing: nothing is left out for it)."""
    lg = _lib_grid()
    bad = {}
    lines = ["START 0", "OK 0", "START 1", "BAD 1 {'Q': 300}: wrong indices", "START 2"]
    assert lg.probe_step(lines, -11, "CUDA_ERROR_ILLEGAL_ADDRESS\n", 0, 5, bad) == 3
    assert sorted(bad) == [1, 2] and "wrong indices" in bad[1] and "died" in bad[2] and "ILLEGAL_ADDRESS" in bad[2]
    assert lg.probe_step(["START 3", "OK 3", "START 4", "OK 4"], 0, "", 3, 5, bad) == 5 and sorted(bad) == [1, 2]
    assert lg.probe_step([], 1, "ImportError: no torch", 3, 5, bad) == 3 and sorted(bad) == [1, 2]
    assert lg.probe_step(["START 3", "OK 3"], 1, "", 3, 5, bad) == 4 and sorted(bad) == [1, 2]
    assert lg.probe_step(["START 4", "OK 4"], 0, "", 4, 5, bad) == 5


def test_choose_caches_picks_per_table_and_hands_out_copies(monkeypatch, tmp_path):
    """choose() remembers a shape's pick while its table stays loaded (a small call's host time), hands
    out copies (a caller editing its params does not edit the cache), and a reloaded table picks anew."""
    shape = {"Q": 8, "M": 1 << 20, "k": 10, "D": 128}
    name, p = rt_mod.choose("knn", shape)
    bq, p["bq"] = p["bq"], -1
    name2, p2 = rt_mod.choose("knn", shape)
    assert name2 == name and p2 == {**p, "bq": bq} and bq > 0
    monkeypatch.setattr(rt_mod, "TABLES", tmp_path)   # no table there: the fallback, not the cached pick
    assert rt_mod.choose("knn", shape)[1] == FALLBACK["knn"]


def test_workspaces_are_per_stream(monkeypatch):
    """Two launches in flight on different streams must not share scratch (a split search's partial
    lists, counters and shared bounds; a Program's norms): Runtime.workspace and a CompiledProgram's
    pool are per stream, the same stream reuses its own. Device allocation is a recording double."""
    from gpu_backend import memory
    from gpu_backend.runner import CompiledProgram, TensorDecl
    allocs = []

    class FakeArray:
        def __init__(self, shape, dtype):
            self.nbytes, self.ptr = int(np.prod(shape)) * memory.SIZE[dtype], 0x1000 * (len(allocs) + 1)
            allocs.append(self)

        def fill_bits(self, bits):
            self.zeroed = bits == 0

        def free(self):
            self.freed = True

    monkeypatch.setattr(memory.DeviceArray, "alloc", classmethod(lambda cls, shape, dtype: FakeArray(shape, dtype)))
    monkeypatch.setattr(memory, "synchronize", lambda: syncs.append(1))
    syncs = []
    rt = object.__new__(rt_mod.Runtime)          # no context: only the workspace table is exercised
    import threading
    rt._workspaces, rt._lock, rt._streams, rt._kernels, rt._prepared = {}, threading.Lock(), {}, {}, {"x": 1}
    rt.plans = {"y": 1}
    a, b = rt.workspace("knn.TH", (64, 1), "i32", stream=11), rt.workspace("knn.TH", (64, 1), "i32", stream=22)
    assert a is not b and a.zeroed and b.zeroed
    assert rt.workspace("knn.TH", (64, 1), "i32", stream=11) is a and rt.workspace("knn.TH", (64, 1), "i32") not in (a, b)
    # a new stream per call: past MAX_STREAMS the others' workspaces go (after a device synchronize)
    for s in range(100, 100 + rt_mod.MAX_STREAMS):
        last = rt.workspace("knn.TH", (64, 1), "i32", stream=s)
    assert getattr(a, "freed", False) and getattr(b, "freed", False) and not getattr(last, "freed", False)
    assert len(rt._streams) <= rt_mod.MAX_STREAMS and {k[3] for k in rt._workspaces} == set(rt._streams)
    assert not rt._prepared and not rt.plans     # launches prepared with freed workspaces are forgotten

    class Spec:
        workspace = [("XN", TensorDecl("f32", [1, "M"]))]
    prog = object.__new__(CompiledProgram)
    prog.spec, prog.pools = Spec(), {}
    p11, p22 = prog.pool(11), prog.pool(22)
    assert p11 is not p22 and prog.pool(11) is p11
    x11, x22 = p11.get({"XN": [1, 100]})["XN"][0], p22.get({"XN": [1, 100]})["XN"][0]
    assert x11 != x22
    prog.drop_pools(keep=22)
    assert list(prog.pools) == [22]


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("variant", [{"bq": 16, "bn": 32, "split": 128, "stages": 4, "merge": "wide", "ws": 4},
                                     {"mma": "wgmma", "bq": 128, "bn": 64, "split": 16, "stages": 4, "merge": "wide"}])
def test_knn_on_two_streams_at_once_matches_float64(variant):
    """Searches queued on two torch streams without waiting for each other (different databases, the
    same split kernel): each matches float64 (with one shared workspace the split CTAs of the two would
    mix partial lists and bounds)."""
    torch = pytest.importorskip("torch")
    from gpu_backend.driver import arch_of, properties
    if variant.get("mma") == "wgmma" and arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    from cakelib import knn
    from tasks.knn.task import TASK
    task = type(TASK)()
    task.k = 16
    shape = {"Q": 40, "M": 300_001}
    inps = [task.make_inputs(shape, seed=s) for s in (5, 6)]
    streams = [torch.cuda.Stream() for _ in inps]
    tens = [tuple(torch.as_tensor(inp[n], device="cuda") for n in ("Xq", "Xb")) for inp in inps]
    torch.cuda.synchronize()                     # the uploads are done; nothing orders the two streams after
    outs = [None] * len(inps)
    for _ in range(3):                           # launches interleaved, several in flight on each stream
        for i, st in enumerate(streams):
            with torch.cuda.stream(st):
                outs[i] = knn(*tens[i], 16, variant=variant)
    torch.cuda.synchronize()
    for inp, (I, Dv) in zip(inps, outs):
        got = {"I": I.cpu().numpy(), "Dist": Dv.cpu().numpy()}
        checks = task.check(got, task.reference(inp, shape), inp, shape)
        assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_planned_calls_return_fresh_contiguous_results():
    """A repeat call (its launch plan) makes its results from the plan's one-element templates: each call's
    are new contiguous tensors of their own, equal to the general path's."""
    torch = pytest.importorskip("torch")
    from cakelib import kmeans, knn
    g = torch.Generator(device="cuda").manual_seed(3)
    xq = torch.randn(5, 128, device="cuda", generator=g).half()
    xb = torch.randn(3000, 128, device="cuda", generator=g).half()
    first = knn(xq, xb, 10)                                   # the general path; plans the call
    runs = [knn(xq, xb, 10) for _ in range(2)]
    ptrs = {t.data_ptr() for run in runs + [first] for t in run}
    assert len(ptrs) == 6
    for I, D in runs:
        assert I.is_contiguous() and D.is_contiguous() and I.shape == (5, 10) and D.dtype == torch.float32
        assert torch.equal(I, first[0]) and torch.equal(D, first[1])
    x = torch.randn(1, 4000, 128, device="cuda", generator=g).half()
    c0 = x[:, :16].clone()
    C1, A1 = kmeans(x, 16, 2, init=c0)
    C2, A2 = kmeans(x, 16, 2, init=c0)
    assert C2.data_ptr() != C1.data_ptr() and C2.is_contiguous() and A2.is_contiguous()
    assert C2.shape == (1, 16, 128) and A2.shape == (1, 4000)
    assert torch.equal(A1, A2) and torch.allclose(C1, C2, rtol=1e-5, atol=1e-5)
