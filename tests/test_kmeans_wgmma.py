"""k-means with the assignment on wgmma (tasks/kmeans/wgmma.py, sm_90a) and the accumulating smem
reduce its centroid norms use. CPU: every sweep variant verifies without errors (the sync simulation
runs) and compiles for sm_90a without spills; the library refuses it off sm_90a; `reduce accumulate`
lowers to an add and the simulator orders it by its rows' threads (same rows and scope: no barrier
needed; another row split: the race is reported). GPU (marked): cakelib.kmeans with each wgmma variant
against float64 (ragged batches, K not a multiple of the centroid tile)."""
import sys
from pathlib import Path

import pytest

from cake_ir.builder import KernelBuilder, tile
from cake_ir.compiler import compile_ir, compile_kernel
from cake_ir.verifier import verify
from tasks.kmeans.wgmma import kmeans_wgmma

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from lib_grid import kmeans_variants  # noqa: E402

WG = [p for p in kmeans_variants() if p.get("mma") == "wgmma"]


@pytest.mark.parametrize("p", WG, ids=lambda p: f"{p['kind']}_k{p['kmax']}_bm{p['bm']}_bn{p['bn']}_u{p.get('urows', 16)}"
                         f"_x{p.get('xstages', 1)}_p{p['ctas']}" + ("_rs" if p.get("sums") == "regs" else "")
                         + {"wgmma": f"_rw{p.get('update_n', 64)}"}.get(p.get("sums"), "") + f"_a{p.get('astages', 1)}"
                         + ("u" if p.get("aunroll") else "") + f"_ch{p.get('chains', 1)}")
def test_wgmma_variants_verify_and_compile_without_spills(p):
    from cakelib.variants import kmeans_kernel, kmeans_name
    assert "_wg" in kmeans_name(p) and "_mma" in kmeans_name(p)
    k = kmeans_kernel(p, "sm_90a")
    v = verify(k)
    assert not [d for d in v.diagnostics if d.severity == "error" or d.code == "N-SYN-01"], \
        [d.short() for d in v.diagnostics]
    r = compile_ir(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics if d.severity == "error"]
    notes = [d.message for d in r.diagnostics if d.code == "N-BACKEND-RESOURCES"]
    if p.get("aunroll") and p["bn"] == 64:   # two [64, 64] accumulators beside the held sums: 255 registers
        assert notes and int(notes[0].split(" B spill stores")[0].rsplit(" ", 1)[1]) <= 40, notes
    else:
        assert notes and "0 B spill stores" in notes[0], notes
    src = r.cuda_source
    assert "wgmma.mma_async" in src and "fence_proxy_async" in src
    adds = [ln for ln in src.split("__global__")[-1].splitlines() if "red_add_shared" in ln]
    assert len(adds) == 2 and all(", 1.0f);" in ln for ln in adds), adds   # only the counts: no CAS on the sums


def test_wgmma_kmeans_needs_sm90a_and_fitting_tiles():
    from cakelib.variants import kmeans_supports
    p = WG[0]
    assert kmeans_supports(p, {"B": 1, "N": 1 << 20, "K": 256, "arch": "sm_90a"})
    assert not kmeans_supports(p, {"B": 1, "N": 1 << 20, "K": 256, "arch": "sm_80"})
    with pytest.raises(ValueError, match="sm_90a"):
        kmeans_wgmma(arch="sm_80")
    with pytest.raises(ValueError, match="kmax <= 128"):
        kmeans_wgmma(kmax=256, resident=True)
    kmeans_wgmma(kmax=256, bm=128, bn=64, urows=32, resident=True, sums="regs")   # no smem sums: room for them
    with pytest.raises(ValueError, match="256 f32 registers per lane"):
        kmeans_wgmma(kmax=256, bm=64, urows=32, sums="regs")       # 4 warps would hold 64 KB each
    with pytest.raises(ValueError, match="evenly over 8 warps"):
        kmeans_wgmma(kmax=64, bm=128, bn=64, urows=32, sums="regs")   # 4 blocks for 8 warps

    with pytest.raises(ValueError, match="multiple of 64"):
        kmeans_wgmma(bm=32)


@pytest.mark.parametrize("form", ["mma", "wgmma", "resident"])
def test_prefetched_point_tiles_are_checked_across_point_tiles(form, monkeypatch):
    """The next point tile loads into the other sX slot during this one (xstages 2; the resident kernel
    always). The simulator now picks sizes at which a persistent CTA runs its point loop twice or more
    (it used to run it once: N below the grid's reach), so a prefetch aimed at the current tile's slot,
    which the update still reads, is reported with the default sizes; it is also checked at 3 point
    tiles per CTA."""
    import json

    import cake_ir.analysis.sync as S
    from cake_ir.io import dumps, load
    from cakelib.variants import kmeans_kernel
    if form == "resident":
        p = {"kind": "resident", "kmax": 128, "bm": 64, "bn": 64, "ctas": 132, "big": 16, "update": "mma"}
    else:
        p = {"kind": "fused", "kmax": 256, "bm": 64, "bn": 64, "ctas": 132, "update": "mma", "norms": "once",
             "xstages": 2, **({"mma": "wgmma"} if form == "wgmma" else {})}
    k = kmeans_kernel(p, "sm_90a")
    assert not [d for d in verify(k).diagnostics if d.severity == "error" or d.code == "N-SYN-01"]
    doc = json.loads(dumps(k))

    def prefetches(node):
        if isinstance(node, dict):
            if node.get("id") == "prefetch_points":
                yield node
            for v in node.values():
                yield from prefetches(v)
        elif isinstance(node, list):
            for v in node:
                yield from prefetches(v)
    pre = next(prefetches(doc))
    pre["dst"]["slot"] = "it % 2"
    bad = [d for d in verify(load(doc)[0]).diagnostics if d.severity == "error"]
    assert any(d.code == "E-SYN-06" and "reads sX" in d.message for d in bad), [d.short() for d in bad]
    sim = next(d.message for d in bad if "simulated with" in d.message)
    n = int(sim.split("N=")[1].split(",")[0].split(")")[0])
    assert n > 132 * 64, sim                                   # more point tiles than CTAs
    monkeypatch.setattr(S.Simulator, "_sizes", lambda self: self._base_env({"B": 1, "N": 3 * 132 * 64 - 5, "K": 100}))
    assert not [d for d in verify(k).diagnostics if d.severity == "error" or d.code == "N-SYN-01"]
    bad = [d for d in verify(load(doc)[0]).diagnostics if d.severity == "error"]
    assert any(d.code == "E-SYN-06" and "reads sX" in d.message for d in bad), [d.short() for d in bad]


def _norms(second_scope=None, accumulate=True):
    """Row norms of a [64, 128] tile stored as two 64-column swizzle atoms, summed atom by atom."""
    kb = KernelBuilder("atom_norms", arch="sm_90a", grid=[1], threads=128)
    kb.tensor("X", "f16", [64, 128])
    kb.tensor("NRM", "f32", [1, 64], access="write")
    kb.buffer("sX", "smem", "f16", [128, 64], layout="swizzle_128B")
    kb.buffer("nv", "smem", "f32", [1, 64])
    kb.buffer("nr", "reg", "f32", [1, 1], layout="row_major", scope="thread")
    with kb.role("main", warps=(0, 4)) as r:
        for a in range(2):
            r.copy("cp_async", tile("X", [0, 64 * a], [64, 64]), tile("sX", [64 * a, 0], [64, 64]))
        r.sync("cp_async_commit")
        r.sync("cp_async_wait", n=0)
        r.sync("syncthreads")
        r.reduce("sum_sq", tile("sX", [0, 0], [64, 64]), tile("nv", [0, 0], [1, 64]))
        r.reduce("sum_sq", tile("sX", [64, 0], [64, 64]), tile("nv", [0, 0], [1, 64]), accumulate=accumulate,
                 scope=second_scope)
        r.sync("syncthreads")
        with r.if_("tid < 64"):
            r.lds(tile("nv", [0, "tid"], [1, 1]), tile("nr"), vec_bytes=4)
            r.stg(tile("nr"), tile("NRM", [0, "tid"], [1, 1]), vec_bytes=4)
    return kb.build()


def test_accumulating_reduce_lowers_to_an_add_and_keeps_its_rows_threads():
    k = _norms()
    assert not [d for d in verify(k).diagnostics if d.severity == "error"], [d.short() for d in verify(k).diagnostics]
    r = compile_kernel(k, arch="sm_90a")
    assert r.ok
    stores = [ln for ln in r.cuda_source.splitlines() if "cake_acc;" in ln and "reinterpret_cast<float*>" in ln]
    assert len(stores) == 2 and " = cake_acc;" in stores[0] and " += cake_acc;" in stores[1], stores
    # the second reduce dealing the rows another way (each warp all of them) reads other threads' sums
    bad = [d for d in verify(_norms(second_scope="warp")).diagnostics if d.severity == "error"]
    assert any(d.code == "E-SYN-11" and "nv" in d.message for d in bad), [d.short() for d in bad]


def test_accumulate_is_refused_for_register_reductions():
    kb = KernelBuilder("reg_acc", arch="sm_80", grid=[1], threads=32)
    kb.tensor("O", "f32", [16, 1], access="write")
    kb.buffer("t", "reg", "f32", [16, 8], layout="mma_acc", scope="warp")
    kb.buffer("s", "reg", "f32", [16, 1], layout="mma_rows", scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        r.fill("t", 1.0)
        r.reduce("sum", tile("t"), tile("s"), accumulate=True)
        r.stg(tile("s"), tile("O"), vec_bytes=4)
    r = compile_kernel(kb.build(), arch="sm_80")
    assert not r.ok and any("accumulate is for shared-memory" in d.message for d in r.diagnostics)


def _gpu():
    try:
        from gpu_backend.driver import gpu_available
        return gpu_available()
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,N,K,i", [(2, 70001, 250, 0), (3, 9999, 170, 1), (2, 5000, 256, 2), (1, 20000, 7, 3),
                                     (3, 4099, 100, 4), (4, 999, 128, 5), (2, 30001, 60, 6), (3, 9999, 127, 7),
                                     # the prefetched point tiles: several per CTA, K not a multiple of BN
                                     (2, 70001, 250, 8), (1, 100003, 65, 9)])
def test_kmeans_wgmma_one_step_matches_float64(B, N, K, i):
    from gpu_backend.driver import arch_of, properties
    if arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    from cakelib import kmeans
    from tasks.kmeans.task import TASK
    variant = WG[i % len(WG)]
    if K > variant["kmax"]:
        pytest.skip("K above the variant's kmax")
    shape = {"B": B, "N": N, "K": K}
    inp = TASK.make_inputs(shape, seed=5)
    X = inp["X"].reshape(B, N, 128)
    C0 = inp["C"].reshape(B, K, 128)
    Cn, A = kmeans(X, K, 1, init=C0, variant=variant)
    checks = TASK.check({"A": A, "Cnew": Cn.reshape(B * K, 128)}, TASK.reference(inp, shape), inp, shape)
    assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]


RS = [p for p in WG if p.get("sums") == "regs"]
HELD = [p for p in WG if p.get("sums") in ("regs", "wgmma")]     # sums in registers (mma.sync or wgmma update)


def _rs_id(p):
    from cakelib.variants import kmeans_name
    return kmeans_name(p)


def test_held_sums_skip_shared_memory_and_flush_from_registers():
    """sums "regs": no smem sums buffer and no per-tile load / store of them; one X fragment per 16 points
    feeds both of a warp's blocks; the flush adds each lane's registers into the workspace (rows >= K
    skipped) before the counts' flush and the finish."""
    import json

    from cake_ir.io import dumps
    from cakelib.variants import kmeans_kernel
    assert len(RS) >= 9
    k = kmeans_kernel(next(p for p in RS if p["kind"] == "resident" and p["kmax"] == 256), "sm_90a")
    assert "ssum" not in {b.name for b in k.buffers}
    ids, ops = set(), []

    def walk(node):
        if isinstance(node, dict):
            if node.get("id"):
                ids.add(node["id"])
            if node.get("op") in ("onehot", "ldmatrix"):
                ops.append(node["op"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(json.loads(dumps(k)))
    assert {"flush_held_sums", "flush_counts", "stage_targets"} <= ids and not ids & {"update_blocks", "store_sums",
                                                                                      "flush_sums", "zero_partials"}
    assert ops.count("ldmatrix") == 128 // 16 and ops.count("onehot") == 2 * (128 // 16)   # bm 128, two blocks
    body = compile_kernel(k, emit="cuda").cuda_source.split("__global__")[-1]
    for j in (0, 1):
        assert f"if (cake_row >= (int)(K - ur{j})) continue;" in body
        assert f"if (uacc{j}[cake_e] != 0.0f) cake::red_add_global(" in body


def test_wgmma_update_holds_sums_in_wgmma_accumulators():
    """sums "wgmma": per 16 points one wgmma_fence / commit / wait 1 (the fragments of two steps back are
    rewritten), each held 64-cluster block x 2 atoms one m64n64k16 with A from registers and B MN-major;
    the flush adds the accumulators (red_add from wgmma_acc); no mma.sync update, no smem sums."""
    from cakelib.variants import kmeans_kernel
    rw = [p for p in WG if p.get("sums") == "wgmma"]
    assert len(rw) >= 7
    k = kmeans_kernel(next(p for p in rw if p["kind"] == "resident" and p["kmax"] == 256), "sm_90a")
    assert "ssum" not in {b.name for b in k.buffers} and not any(b.name.startswith("uacc") for b in k.buffers)
    res = verify(k)
    assert res.ok and not [d for d in res.diagnostics if d.code == "N-SYN-01"], [d.short() for d in res.diagnostics]
    body = compile_kernel(k, emit="cuda").cuda_source.split("__global__")[-1]
    # twice: a whole tile of points (no test of N in the one-hot) and a batch's last tile
    assert body.count("cake_wgmma_rs_m64n64k16_f16_t1(&S") == 2 * 8 * 2 * 2      # 8 steps x 2 blocks x 2 atoms
    assert body.count("cake::wgmma_wait<1>()") == 2 * 8 and "mma_16816_f16" not in body
    whole, tail = body.split("if (n0 + BM <= N) {")[1].split("else {", 1)
    assert "cake_cl" not in whole and "< cake_cl ?" in tail
    # one one-hot fragment per warp and step for both blocks: a warp's rows of the two blocks are 32 consecutive
    # clusters (block j its row tile j, registers 4 j ..), flushed 16 rows further per warp
    import json

    from cake_ir.io import dumps
    doc = json.loads(dumps(k))
    hots = [s for lst in _lists(doc) for s in lst if isinstance(s, dict) and s.get("op") == "onehot"]
    assert len(hots) == 2 * 8 and {h["row0"] for h in hots} == {"uw"} and {h["dst"]["buf"] for h in hots} == {"oh_0", "oh_1"}
    assert "&oh_0[4]" in body and "&oh_1[0]" in body
    assert "b * K + ur1 + 16 * (role_warp % 4)" in json.dumps(doc)
    assert "if (S0_0[cake_e] != 0.0f) cake::red_add_global(" in body
    with pytest.raises(ValueError, match="evenly over the 2 warpgroups"):
        kmeans_wgmma(kmax=192, bm=128, bn=64, sums="wgmma")


def test_red_add_from_an_accumulator_lowers_per_lane_and_checks_its_shape():
    """red_add from an mma_acc tile: each lane adds its elements at acc_coords; the verifier takes an
    mma_acc source (E-ATOM-01) and still refuses another register layout."""
    kb = KernelBuilder("red_acc", arch="sm_80", grid=[1], threads=32)
    kb.tensor("S", "f32", [32, 16], access="readwrite")
    kb.buffer("acc", "reg", "f32", [32, 16], layout="mma_acc", scope="warp")
    kb.buffer("blk", "reg", "f32", [32, 16], layout="blocked", vec=1, scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        r.fill("acc", 1.0)
        r.add("red_add", src=tile("acc"), dst=tile("S", [0, 0], [32, 16]), row_limit=20)
    k = kb.build()
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics]
    src = compile_kernel(k, emit="cuda").cuda_source
    assert "if (cake_row >= (int)(20)) continue;" in src and "cake::red_add_global((S + " in src
    assert compile_ir(k, arch="sm_80").ok
    bad = k.model_copy(deep=True)
    bad.roles[0].body[1].src.buf = "blk"
    assert any(d.code == "E-ATOM-01" for d in verify(bad).diagnostics)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,N,K", [(2, 70001, 250), (3, 9999, 100), (1, 300007, 37)])
@pytest.mark.parametrize("p", HELD, ids=_rs_id)
def test_held_sums_one_step_matches_float64(p, B, N, K):
    """The register-held sums (`_rs`: mma.sync update; `_rw`: wgmma update, A = the one-hot from registers,
    B = the points MN-major) against float64: ragged point tiles, K not a multiple of the centroid tile or
    of a block's rows (blocks past K skip their product and flush), several point tiles per CTA."""
    from gpu_backend.driver import arch_of, properties
    if arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    if K > p["kmax"]:
        pytest.skip("K above the variant's kmax")
    from cakelib import kmeans
    from tasks.kmeans.task import TASK
    shape = {"B": B, "N": N, "K": K}
    inp = TASK.make_inputs(shape, seed=11)
    Cn, A = kmeans(inp["X"].reshape(B, N, 128), K, 1, init=inp["C"].reshape(B, K, 128), variant=p)
    checks = TASK.check({"A": A, "Cnew": Cn.reshape(B * K, 128)}, TASK.reference(inp, shape), inp, shape)
    assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]


A2 = [p for p in WG if p.get("astages", 1) == 2 and not p.get("aunroll")]
AU = [p for p in WG if p.get("aunroll")]


def _with_ids(node, ids, found):
    if isinstance(node, dict):
        if node.get("id") in ids:
            found.append(node)
        for v in node.values():
            _with_ids(v, ids, found)
    elif isinstance(node, list):
        for v in node:
            _with_ids(v, ids, found)
    return found


def _lists(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from _lists(v)
    elif isinstance(node, list):
        yield node
        for v in node:
            yield from _lists(v)


def test_paired_centroid_tiles_overlap_an_argmin_with_the_next_wgmma():
    """astages 2: the resident centroid loop goes by pairs of tiles on two accumulators: both tiles' wgmma
    committed as two groups, wait_group 1 before the first tile's argmin (the second still in flight),
    wait_group 0 before the second's; it verifies and ptxas keeps the wgmma pipelined (no
    W-BACKEND-WGMMA-SERIAL). The same kernel with the second tile's wgmma made conditional is serialized by
    ptxas, and that comes back as W-BACKEND-WGMMA-SERIAL."""
    import json

    from cake_ir.io import dumps, load
    from cakelib.variants import kmeans_kernel, kmeans_name
    assert {kmeans_name(p) for p in A2} >= {"kmeans_resident_k256_bm128_bn32_p132_mma16_wg_rw128_a2",
                                            "kmeans_resident_k128_bm128_bn32_p132_mma16_wg_rw128_a2"}
    p = next(p for p in A2 if p["kmax"] == 256)
    k = kmeans_kernel(p, "sm_90a")
    assert {"acc", "acc1"} <= {b.name for b in k.buffers}
    res = verify(k)
    assert res.ok and not [d for d in res.diagnostics if d.code == "N-SYN-01"], [d.short() for d in res.diagnostics]
    doc = json.loads(dumps(k))
    loop = _with_ids(doc, {"centroid_pairs"}, [])[0]
    ops = [(s["op"], s.get("n")) for s in loop["body"] if s["op"] in ("wgmma_commit", "wgmma_wait")] \
        if all("op" in s for s in loop["body"]) else None
    assert ops == [("wgmma_commit", None), ("wgmma_commit", None), ("wgmma_wait", 1), ("wgmma_wait", 0)], ops
    r = compile_ir(k, arch="sm_90a")
    assert r.ok and not [d for d in r.diagnostics if d.code in ("W-BACKEND-WGMMA-SERIAL", "W-BACKEND-SPILL")], \
        [d.short() for d in r.diagnostics if d.severity != "note"]
    # rotated: the next pair's first tile issued (where it exists) during this pair, across the back edge;
    # it verifies, but ptxas serializes every wgmma of the kernel
    body = loop["body"]
    assert body[4]["op"] == "wgmma_fence" and body[7]["op"] == "wgmma_commit" and body[9]["op"] == "topk"
    first = json.dumps(body[0:3])
    nxt = json.loads(first.replace("(2 * u)", "min(2 * u + 2, KMAX / BN - 2)").replace('"distances"', '"distances_next"'))
    loop["body"] = body[4:10] + [{"op": "if", "cond": "2 * u + 2 < cdiv(K, BN)", "then": nxt},
                                 {"op": "wgmma_commit"}, {"op": "wgmma_wait", "n": 1}] + body[11:]
    parent = next(lst for lst in _lists(doc) if any(x is loop for x in lst))
    i = next(j for j, x in enumerate(parent) if x is loop)
    parent[i:i + 1] = json.loads(first.replace("(2 * u)", "0")) + [{"op": "wgmma_commit"}, loop,
                                                                     {"op": "wgmma_wait", "n": 0}]
    bad = load(doc)[0]
    assert verify(bad).ok, [d.short() for d in verify(bad).diagnostics if d.severity == "error"]
    r = compile_ir(bad, arch="sm_90a")
    serial = [d for d in r.diagnostics if d.code == "W-BACKEND-WGMMA-SERIAL"]
    assert r.ok and serial and "serialized" in serial[0].message, [d.short() for d in r.diagnostics if d.severity != "note"]
    with pytest.raises(ValueError, match="resident form"):
        kmeans_wgmma(kmax=256, bm=128, bn=64, sums="wgmma", update_n=128, astages=2)     # streamed centroids
    with pytest.raises(ValueError, match="even number of centroid tiles"):
        kmeans_wgmma(kmax=192, bm=128, bn=64, resident=True, sums="regs", astages=2)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,N,K,kmax", [(2, 70001, 256, 256), (3, 9999, 70, 256), (1, 20000, 7, 256),
                                        (3, 4099, 100, 128), (2, 30001, 33, 128), (4, 999, 128, 128)])
def test_paired_centroid_tiles_match_float64(B, N, K, kmax):
    """astages 2 against float64: K a whole number of tile pairs, an odd number of tiles (the last pair's
    second tile past K, masked), a single tile, several batches and point tiles per CTA."""
    from gpu_backend.driver import arch_of, properties
    if arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    from cakelib import kmeans
    from tasks.kmeans.task import TASK
    variant = next(p for p in A2 if p["kmax"] == kmax and p["bn"] == 32)
    shape = {"B": B, "N": N, "K": K}
    inp = TASK.make_inputs(shape, seed=7)
    Cn, A = kmeans(inp["X"].reshape(B, N, 128), K, 1, init=inp["C"].reshape(B, K, 128), variant=variant)
    checks = TASK.check({"A": A, "Cnew": Cn.reshape(B * K, 128)}, TASK.reference(inp, shape), inp, shape)
    assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]


CH = [p for p in WG if p.get("chains", 1) > 1]


def test_argmin_chains_lower_to_independent_running_bests():
    """topk `chains` (k = 1 over wgmma_acc): per row `chains` running bests, column pair n into best
    n % chains, joined into the first by the exact (value, smaller index) test before the list insert;
    a chains count that does not divide the lane's column pairs (N / 8), or chains with k > 1, is an
    error naming the node and the legal values."""
    import json

    from cake_ir.io import dumps, load
    from cakelib.variants import kmeans_kernel
    assert {p["chains"] for p in CH} == {2, 4} and len(CH) >= 2
    p = next(p for p in CH if p["kmax"] == 256 and p["ctas"] == 132 and p["chains"] == 4)
    k = kmeans_kernel(p, "sm_90a")
    r = compile_ir(k, arch="sm_90a")
    assert r.ok and not [d for d in r.diagnostics if d.code in ("W-BACKEND-WGMMA-SERIAL", "W-BACKEND-SPILL")]
    body = r.cuda_source.split("__global__")[-1]
    assert "float cake_bu[8]; int cake_bc[8];" in body                 # 2 rows per lane x 4 chains
    assert body.count("cake_bu[0 * 4 + cake_n % 4]") == 2 * 2 and body.count("cake_bu[1 * 4 + cake_n % 4]") == 2 * 2
    for a, o in ((0, 1), (0, 2), (0, 3), (4, 5), (4, 6), (4, 7)):
        assert (f"if (cake_bu[{o}] < cake_bu[{a}] || (cake_bu[{o}] == cake_bu[{a}] && cake_bc[{o}] < cake_bc[{a}]))"
                in body), (a, o)
    assert "cake_bu[4] + " not in body and "cake_bu[4], cake_cb + cake_bc[4]" in body   # slot 1 inserts its first
    doc = json.loads(dumps(k))
    node = _with_ids(doc, {"argmin"}, [])[0]
    node["chains"] = 3                                                  # N / 8 = 8 column pairs per lane
    r = compile_ir(load(doc)[0], arch="sm_90a", emit="cuda")
    bad = [d for d in r.diagnostics if d.severity == "error"]
    assert not r.ok and bad and "chains (3) must divide" in bad[0].message and "[1, 2, 4, 8]" in bad[0].message
    assert bad[0].node.startswith("/roles/0/"), bad[0].node
    node.update(chains=2, k=2)     # (the verifier refuses the [16, 1] lists for k = 2 first: lower it anyway)
    r = compile_ir(load(doc)[0], arch="sm_90a", emit="cuda", verify_first=False)
    assert not r.ok and any("chains is for k = 1" in d.message for d in r.diagnostics if d.severity == "error")


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,N,K,chains", [(2, 70001, 250, 4), (3, 9999, 7, 4), (1, 20000, 64, 2), (4, 999, 100, 2),
                                          (2, 30001, 129, 4)])
def test_argmin_chains_match_float64(B, N, K, chains):
    """chains against float64: K below, at and past a centroid tile (the limit's partial-tile scan), several
    batches and point tiles per CTA."""
    from gpu_backend.driver import arch_of, properties
    if arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    from cakelib import kmeans
    from tasks.kmeans.task import TASK
    variant = next(p for p in CH if p["kmax"] == 256 and p["ctas"] == 132 and p["chains"] == chains)
    shape = {"B": B, "N": N, "K": K}
    inp = TASK.make_inputs(shape, seed=11)
    Cn, A = kmeans(inp["X"].reshape(B, N, 128), K, 1, init=inp["C"].reshape(B, K, 128), variant=variant)
    checks = TASK.check({"A": A, "Cnew": Cn.reshape(B * K, 128)}, TASK.reference(inp, shape), inp, shape)
    assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]


def test_static_centroid_sequence_pipelines_every_tile():
    """aunroll: the KMAX / BN tiles in one static sequence on two accumulators, tile t + 1's wgmma committed
    before tile t's argmin (wait_group 1), the last argmin after wait_group 0; no loop over the tiles; it
    verifies and ptxas keeps the wgmma pipelined (no W-BACKEND-WGMMA-SERIAL)."""
    import json

    from cake_ir.io import dumps
    from cakelib.variants import kmeans_kernel, kmeans_name
    assert {kmeans_name(p) for p in AU} == {"kmeans_resident_k256_bm128_bn32_p132_mma16_wg_rw128_a2u",
                                            "kmeans_resident_k256_bm128_bn64_p132_mma16_wg_rw128_a2u"}
    p = next(p for p in AU if p["bn"] == 32)
    k = kmeans_kernel(p, "sm_90a")
    res = verify(k)
    assert res.ok and not [d for d in res.diagnostics if d.code == "N-SYN-01"], [d.short() for d in res.diagnostics]
    doc = json.loads(dumps(k))
    assert not _with_ids(doc, {"centroid_loop", "centroid_pairs"}, [])
    tiles = _with_ids(doc, {"argmin"} | {f"argmin_{t}" for t in range(1, 8)}, [])
    assert len(tiles) == 256 // 32
    body = next(lst for lst in _lists(doc) if any(x is tiles[0] for x in lst))
    first = next(i for i, x in enumerate(body) if x.get("id") == "distances")
    last = max(i for i, x in enumerate(body) if any(x is t for t in tiles))
    waits = [s["n"] for s in body[first:last] if s.get("op") == "wgmma_wait"]
    assert waits == [1] * 7 + [0], waits
    r = compile_ir(k, arch="sm_90a")
    assert r.ok and not [d for d in r.diagnostics if d.code in ("W-BACKEND-WGMMA-SERIAL", "W-BACKEND-SPILL")], \
        [d.short() for d in r.diagnostics if d.severity != "note"]
    with pytest.raises(ValueError, match="astages 2"):
        kmeans_wgmma(kmax=256, bm=128, bn=64, resident=True, sums="wgmma", update_n=128, aunroll=True)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,N,K,bn", [(2, 70001, 256, 64), (3, 9999, 70, 32), (1, 20000, 7, 64), (4, 999, 250, 32)])
def test_static_centroid_sequence_matches_float64(B, N, K, bn):
    """aunroll against float64: K = KMAX, K far below it (tiles past K computed and masked), several batches."""
    from gpu_backend.driver import arch_of, properties
    if arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    from cakelib import kmeans
    from tasks.kmeans.task import TASK
    variant = next(p for p in AU if p["bn"] == bn)
    shape = {"B": B, "N": N, "K": K}
    inp = TASK.make_inputs(shape, seed=17)
    Cn, A = kmeans(inp["X"].reshape(B, N, 128), K, 1, init=inp["C"].reshape(B, K, 128), variant=variant)
    checks = TASK.check({"A": A, "Cnew": Cn.reshape(B * K, 128)}, TASK.reference(inp, shape), inp, shape)
    assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]
