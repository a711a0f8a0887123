"""The faster kNN kernels on the CPU: the filtered top-k epilogue (k > 1) and the database-norms Program
(`knn_fused(norms="global")`: a norms kernel writes XN once, the search kernel streams it) verify and
compile with NVRTC for sm_80 and sm_90a; the sync simulator checks a topk's staged bias vector by its own
slot. GPU runs (marked) check the new variants against float64 through the task's evaluator and cakelib."""
import pytest

from cake_ir.compiler import compile_ir
from cake_ir.nodes import Program
from cake_ir.verifier import verify
from tasks.base import get_task
from tasks.knn.programs import knn_db_norms, knn_fused

GN = {"bq": 64, "bn": 64, "split": 1, "stages": 2, "norms": "global"}
GN_SPLIT = {"bq": 16, "bn": 32, "split": 512, "stages": 4, "norms": "global", "merge": "wide"}
# the few-query stream: 4 warps per CTA, each its own database chunk, smem ring and tile norms
WS4 = {"bq": 16, "bn": 32, "split": 128, "stages": 4, "merge": "wide", "ws": 4}


def _errors(res):
    return [d.short() for d in res.diagnostics if d.severity == "error"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("metric,k,p", [
    ("l2", 10, GN), ("l2", 16, GN_SPLIT), ("l2", 10, {**GN, "minb": 3}), ("ip", 10, GN),
    ("l2", 32, {"bq": 64, "bn": 64, "split": 1, "stages": 2}), ("l2", 16, {"bq": 32, "bn": 64, "split": 8, "stages": 3}),
    ("l2", 10, {"bq": 64, "bn": 64, "split": 32, "stages": 2, "norms": "global", "merge": "wide"}),
    ("ip", 16, {"bq": 16, "bn": 32, "split": 128, "stages": 4, "merge": "wide"}),
    ("l2", 1, {"bq": 32, "bn": 64, "split": 32, "stages": 3, "merge": "wide"}),
    ("l2", 10, {**GN, "qfrag": "smem", "minb": 4}), ("ip", 16, {**GN_SPLIT, "qfrag": "smem"}),
    ("l2", 10, {**GN, "qfrag": "smem", "wm": 32}),
    ("l2", 10, {"bq": 32, "bn": 64, "split": 32, "stages": 3, "norms": "global", "qfrag": "smem", "wm": 32,
                "merge": "wide"}),
    ("l2", 10, WS4), ("l2", 16, {**WS4, "norms": "global"}), ("ip", 16, {**WS4, "split": 8}),
    ("l2", 10, {**WS4, "bq": 32, "wm": 32, "stages": 3, "split": 64}), ("l2", 1, {**WS4, "bn": 64, "stages": 2}),
    # the deferred top-k insertion (a queue of T pending entries per row and lane)
    ("l2", 16, {**GN_SPLIT, "queue": 4}), ("ip", 10, {**GN, "queue": 2}), ("l2", 16, {**WS4, "queue": 4}),
    ("l2", 10, {**WS4, "bq": 32, "wm": 32, "stages": 3, "split": 64, "queue": 2})])
def test_variants_verify_and_compile(arch, metric, k, p):
    from cakelib.variants import knn_kernel
    ir = knn_kernel(p, k, metric, 128, arch)
    # norms "global" makes a Program for l2; ip has no norms: a plain kernel
    assert isinstance(ir, Program) == (metric == "l2" and p.get("norms") == "global")
    res = compile_ir(ir, arch=arch)
    assert res.ok, _errors(res)


def test_norms_program_shape():
    prog = knn_fused("l2", k=10, norms="global", arch="sm_90a")
    assert [k.name for k in prog.kernels] == ["knn_db_norms_d128", "knn_l2_k10_d128_64x64_gn"]
    assert [(w.name, w.dtype) for w in prog.workspace] == [("XN", "f32")]
    search = prog.kernels[1]
    ops = {getattr(s, "id", None) for s in _walk(search.roles[0].body)}
    assert "db_norms" not in ops and "prefetch_norms" in ops      # no per-tile reduce in the search kernel
    assert compile_ir(knn_db_norms(arch="sm_80"), arch="sm_80").ok


def _walk(body):
    for s in body:
        yield s
        for f in ("body", "then", "else_"):
            sub = getattr(s, f, None)
            if isinstance(sub, list):
                yield from _walk(sub)


def test_wide_merge_covers_every_split_once():
    """Thread (g, qq) of the wide merge reads rows j = 2 (jj U + u) + g: every split of its query once."""
    from tasks.knn.programs import _merge_unroll
    for split, k, bn, halves in ((8, 10, 32, 2), (32, 16, 64, 2), (512, 16, 32, 2), (128, 32, 64, 2), (32, 10, 64, 1),
                                 (8, 16, 64, 1)):
        U = _merge_unroll(split, k, 128, bn, 16 * halves, "smem", halves)
        seen = sorted((jj * U + u) * halves + g for g in range(halves) for jj in range(split // (halves * U))
                      for u in range(U))
        assert seen == list(range(split)), (split, U)


def test_stream_merge_covers_every_list_once():
    """ws warps per CTA: each CTA merges its warps' lists first, so the last CTA deals SPLIT partial
    lists per query to 32 * ws / BQ thread groups; every list is read once, and a split the groups
    cannot share evenly is refused."""
    from tasks.knn.programs import _merge_unroll
    for split, ws, bq, k in ((128, 4, 16, 10), (8, 4, 16, 16), (64, 4, 32, 10), (32, 4, 32, 1)):
        lists, halves = split, 32 * ws // bq
        U = _merge_unroll(lists, k, 128, 32, bq, "reg", halves)
        seen = sorted((jj * U + u) * halves + g for g in range(halves) for jj in range(lists // (halves * U))
                      for u in range(U))
        assert seen == list(range(lists)), (split, ws, U)
    with pytest.raises(ValueError, match="multiple of 8"):
        knn_fused("l2", k=10, bq=16, bn=32, split=132, stages=4, merge="wide", ws=4)
    with pytest.raises(ValueError, match="ws > 1"):
        knn_fused("l2", k=10, bq=64, bn=32, split=32, stages=4, merge="wide", ws=4)


def _mutate(kernel, where: str):
    """A copy of the stream kernel with one synchronisation removed or one tile offset broken."""
    doc = kernel.model_dump(exclude_none=True)
    body = doc["roles"][0]["body"]
    loop = next(s for s in body if s.get("id") == "db_loop")["body"]
    if where == "query_norms_barrier":       # every warp reads the norms warp 0 wrote
        i = next(i for i, s in enumerate(body) if s.get("id") == "query_norms")
        assert body[i + 1]["op"] == "syncthreads"
        del body[i + 1]
    elif where == "loop_syncwarp":           # the prefetch overwrites a slot other lanes still read
        assert loop[1]["op"] == "syncwarp"
        del loop[1]
    elif where == "norms_syncwarp":          # the tile's norms read before every lane wrote them
        i = next(i for i, s in enumerate(loop) if s.get("id") == "db_norms")
        assert loop[i + 1]["op"] == "syncwarp"
        del loop[i + 1]
    elif where == "shared_rows":             # every warp prefetches into warp 0's rows
        next(s for s in loop if s.get("op") == "if")["then"][0]["dst"]["offset"] = [0, 0]
    elif where == "warp_lists_barrier":      # thread qq merges lists other warps have not staged yet
        i = next(i for i, s in enumerate(body) if s.get("id") == "stage_warp_lists")
        assert body[i + 2]["op"] == "syncthreads"
        del body[i + 2]
    return type(kernel).model_validate(doc)


@pytest.mark.parametrize("where", ["query_norms_barrier", "loop_syncwarp", "norms_syncwarp", "shared_rows",
                                   "warp_lists_barrier"])
def test_stream_kernel_synchronisation_is_checked(where):
    """The warp-private pipeline (warp-scope cp.async, syncwarp, a warp-scope norms reduce) verifies
    clean, and each missing barrier or shared slot is reported: the sync simulator runs (the trip
    count is warp-uniform) and sees each warp's rows of sB / cn as its own (per-warp regions)."""
    kern = knn_fused("l2", k=10, bq=16, bn=32, split=128, stages=4, merge="wide", ws=4, arch="sm_90a")
    assert not _errors(verify(kern))
    bad = _errors(verify(_mutate(kern, where)))
    assert [e for e in bad if "E-SYN" in e], where


def test_filtered_topk_lowering():
    from cake_ir.compiler import compile_kernel
    src = compile_kernel(knn_fused("l2", k=10, arch="sm_90a"), emit="cuda").cuda_source
    # one FMA per score (no row bias), the quad threshold moved by the row bias with a margin, the exact
    # insertion only behind the per-row test
    assert "fmaf(-2.0f, acc[" in src
    assert "cake_thr = fminf(cake::quad_min(cake_tv[9]), cake::quad_max(cake_tv[2]))" in src
    assert "const float cake_thu = (cake_thr - cake_rb) + " in src
    assert "if (cake_best <= cake_thu)" in src
    ip = compile_kernel(knn_fused("ip", k=10, arch="sm_90a"), emit="cuda").cuda_source
    assert "cake_thr = fmaxf(cake::quad_max(cake_tv[9]), cake::quad_min(cake_tv[2]))" in ip
    assert "if (cake_best >= cake_thu)" in ip
    # lists merged before the selection (here: inside its loop) hold one list in all 4 lanes of a quad:
    # only a lane's own k-th bounds the row there
    doc = knn_fused("l2", k=10, arch="sm_90a").model_dump(exclude_none=True)
    body = doc["roles"][0]["body"]
    merge = next(st for st in body if st.get("id") == "merge")
    loop = next(st for st in body if st.get("id") == "db_loop")
    loop["body"].insert(0, {**merge, "id": "early_merge"})
    merged = compile_kernel(type(knn_fused("l2", k=10, arch="sm_90a")).model_validate(doc), emit="cuda").cuda_source
    assert "const float cake_thr = cake::quad_min(cake_tv[9]);" in merged and "quad_max(cake_tv[2])" not in merged
    # k = 1 (k-means' argmin) keeps the plain per-score test
    km = compile_kernel(get_task("kmeans").seed_programs()["kmeans_fused_sm80"], emit="cuda").cuda_source
    assert "cake_thu" not in km


def test_staged_col_bias_read_is_checked_by_its_slot():
    """The search kernel reads XN's slot t % stages while the prefetch fills (t + 1) % stages: clean.
    Reading the slot being filled is a race the simulator reports (it used to evaluate the bias slot
    as the score tile's)."""
    prog = knn_fused("l2", k=10, norms="global", arch="sm_90a")
    search = prog.kernels[1]
    assert not [d for d in verify(search).diagnostics if d.code.startswith("E-SYN")]
    doc = search.model_dump(exclude_none=True)
    loop = next(s for s in doc["roles"][0]["body"] if s.get("id") == "db_loop")
    sel = next(s for s in loop["body"] if s.get("id") == "select")
    sel["col_bias"]["slot"] = "(t + 1) % 2"
    bad = type(search).model_validate(doc)
    assert [d for d in verify(bad).diagnostics if d.code == "E-SYN-06"]


# ------------------------------------------------------------------ GPU
def _gpu():
    from gpu_backend.driver import gpu_available
    return gpu_available()


needs_gpu = pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")


K32_SPLITS = [("sync", dict(bq=16, bn=32, split=32, stages=4, merge="wide", ws=4)),
              ("sync", dict(bq=64, bn=64, split=32, stages=2, norms="global", merge="wide")),
              ("wgmma", dict(bq=128, bn=64, split=16, stages=4))]


def _k32_split(kind, kw, arch):
    from tasks.knn.wgmma import knn_wgmma
    return knn_fused("l2", k=32, arch=arch, **kw) if kind == "sync" else knn_wgmma(metric="l2", k=32, d=128, arch=arch, **kw)


@pytest.mark.parametrize("kind, kw", K32_SPLITS)
def test_split_search_at_k32_builds_without_spills(kind, kw):
    """The k = 32 split kernels the GPU test below runs verify and ptxas builds them for sm_90a without
    spills (the ws4 stream's 4-stage ring at k = 32 is over sm_80's shared memory)."""
    from cake_ir.compiler import compiled_parts
    res = compile_ir(_k32_split(kind, kw, "sm_90a"))
    assert res.ok, [d.short() for d in res.diagnostics if d.severity == "error"]
    assert all(p.resources.get("spill_store_bytes", 0) == 0 for p in compiled_parts(res)), \
        [p.resources for p in compiled_parts(res)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kind, kw", K32_SPLITS)
def test_split_search_at_k32_passes_evaluator_on_gpu(kind, kw):
    """The split path at k = 32 (verified since E-RES-05 counts live ranges; built by ptxas without
    spills) against the float64 reference, through the task's evaluator: what must pass before
    cakelib.variants.KNN_K_MAX_SPLIT lets the library and the sweep use it."""
    from gpu_backend.evaluate import evaluate
    t = type(get_task("knn"))()
    t.k = 32
    rec = evaluate(_k32_split(kind, kw, "sm_90a"), t, profile=False, seed=7, reruns=1)
    assert rec.status == "ok", (rec.error_class, rec.message)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kw", [dict(norms="global"), dict(norms="global", bq=16, bn=32, split=64, stages=4),
                                dict(bq=16, bn=32, split=64, stages=4, merge="wide"),
                                dict(norms="global", bq=32, bn=64, split=8, stages=3, merge="wide", qfrag="smem",
                                     minb=2),
                                dict(bq=16, bn=32, split=32, stages=4, merge="wide", ws=4)])
def test_knn_norms_program_passes_evaluator_on_gpu(kw):
    from gpu_backend.evaluate import evaluate
    t = get_task("knn")
    rec = evaluate(knn_fused("l2", k=t.k, **kw), t, profile=False, seed=99, reruns=1)
    assert rec.status == "ok", (rec.error_class, rec.message)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric,Q,M,k,variant", [
    ("l2", 130, 4099, 10, GN), ("l2", 37, 20001, 16, {**GN_SPLIT, "split": 8}),
    ("l2", 200, 5003, 32, {**GN, "minb": 3}), ("l2", 70, 9999, 32, {"bq": 64, "bn": 64, "split": 1, "stages": 2}),
    ("ip", 50, 7001, 10, GN), ("l2", 1, 1_000_003, 16, GN_SPLIT),
    ("l2", 1, 300_001, 10, {**GN_SPLIT, "merge": "serial"}), ("ip", 5, 200_003, 16, {**GN_SPLIT, "split": 128}),
    ("l2", 100, 60_001, 10, {"bq": 64, "bn": 64, "split": 8, "stages": 2, "norms": "global", "merge": "wide"}),
    ("l2", 300, 20_001, 10, {**GN, "qfrag": "smem", "minb": 4}),
    ("l2", 33, 50_001, 16, {**GN_SPLIT, "split": 32, "qfrag": "smem"}),
    ("l2", 90, 40_001, 10, {"bq": 32, "bn": 64, "split": 8, "stages": 3, "norms": "global", "qfrag": "smem", "wm": 32,
                            "merge": "wide"}),
    ("l2", 150, 30_001, 10, {**GN, "qfrag": "smem", "wm": 32}),
    ("l2", 1, 1_000_003, 10, WS4), ("l2", 37, 20_001, 16, {**WS4, "split": 8}),
    ("ip", 5, 200_003, 16, {**WS4, "split": 32}), ("l2", 3, 50_001, 16, {**WS4, "norms": "global"}),
    ("l2", 90, 40_001, 10, {**WS4, "bq": 32, "wm": 32, "stages": 3, "split": 8}),
    ("l2", 2, 70_001, 1, {**WS4, "bn": 64, "stages": 2, "split": 64})])
def test_cakelib_knn_new_variants_match_float64(metric, Q, M, k, variant):
    check_cakelib_knn(metric, Q, M, k, variant, seed=5)


def check_cakelib_knn(metric: str, Q: int, M: int, k: int, variant: dict, seed: int) -> None:
    """cakelib.knn with `variant` on the task's inputs, through the task's float64 checks."""
    from cakelib import knn
    task = type(get_task("knn" if metric == "l2" else "knn_ip"))()
    task.k = k
    shape = {"Q": Q, "M": M}
    inp = task.make_inputs(shape, seed=seed)
    I, Dv = knn(inp["Xq"], inp["Xb"], k, metric=metric, variant=variant)
    checks = task.check({"I": I, "Dist": Dv}, task.reference(inp, shape), inp, shape)
    assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]


def test_search_loop_static_cost():
    """bench/sass_hot_path.py on the sm_90a search kernel (needs nvdisasm): with the norms computed once
    the database loop has no inner loop (the per-tile norm reduce) and its no-insertion path is ~220
    instructions per thread per 64-row tile (it was ~430 plus the reduce before the filtered epilogue). The
    inner loops left are the rolled insertions (`topk` rolled: one per row slot, selects and
    compares, no loads), which the hot path skips."""
    import sys
    from pathlib import Path
    from cake_ir.analysis.sass import find_nvdisasm
    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not found")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from sass_hot_path import measure
    gn = measure(knn_fused("l2", k=10, norms="global", arch="sm_90a").kernels[1], "sm_90a")
    per_tile = measure(knn_fused("l2", k=10, arch="sm_90a"), "sm_90a")
    def reduces(m):   # the per-tile norm reduce: loads from smem; the rolled insertion loop has none
        return [lp for lp in m["inner_loops"] if "LDS" in lp["ops"]]
    assert reduces(gn) == [] and reduces(per_tile)
    assert len(gn["inner_loops"]) == 2 and all(set(lp["ops"]) <= {"FSEL", "SEL", "ISETP", "FSETP", "IADD3", "LOP3",
                                                                  "FADD", "IMAD", "FLO", "BREV", "POPC", "BRA"}
                                               for lp in gn["inner_loops"]), gn["inner_loops"]
    assert gn["hot"] <= 260 and gn["spill_instructions"] == 0 and gn["spill_bytes"] == 0
    assert gn["regs"] and gn["regs"] <= 200


def _f32(x):
    import numpy as np
    return np.float32(x)


def _filtered_row_topk(u_tiles, rb, k, kind="min", queue=0, flush_rng=None, merge_flushes=True):
    """A float32 model of the lowering's filtered top-k for one row: 4 quad lanes, lane q holds columns
    n * 8 + 2 q + j of each tile, keeps its own sorted (value, index) list; per tile the lane's best u is
    tested against the row's threshold (the quad's best k-th value or the worst of its ceil(k / 4)-th
    values, the tighter) moved by the row bias (margin as emitted), then each score
    v = u + rb against that k-th value and topk_insert's exact (value, index) test; the lanes merge.

    queue = T: the deferred insertion: a passing score is pushed onto the lane's queue unless it is full
    (then inserted on the spot); after the tile's scan the lanes flush when the warp's vote says so:
    here when any of the quad's lanes is half full or, the other 28 lanes of the warp, when flush_rng
    says (any schedule must be exact); the merge flushes what is left."""
    sign = 1.0 if kind == "min" else -1.0
    lanes = [[(sign * 3e38, -1)] * k for _ in range(4)]
    queues = [[] for _ in range(4)]

    def better(a, b):   # (value, index) order of cake::topk_better
        return (a[0] < b[0] or (a[0] == b[0] and a[1] < b[1])) if kind == "min" else \
            (a[0] > b[0] or (a[0] == b[0] and a[1] < b[1]))

    def insert(lst, c):
        if better(c, lst[-1]):
            lst[-1] = c
            lst.sort(key=lambda e: ((e[0] if kind == "min" else -e[0]), e[1]))

    cb = 0
    for u in u_tiles:
        tn = len(u)
        j = -(-k // 4) - 1   # the quad's ceil(k / 4)-th entries: 4 lanes hold >= k entries that good
        if kind == "min":
            thr = min(min(l[-1][0] for l in lanes), max(l[j][0] for l in lanes))
        else:
            thr = max(max(l[-1][0] for l in lanes), min(l[j][0] for l in lanes))
        marg = _f32(_f32(abs(thr) + abs(rb)) * _f32(9.5367431640625e-07) + _f32(1e-30))
        thu = _f32(_f32(thr - rb) + marg) if kind == "min" else _f32(_f32(thr - rb) - marg)
        for q in range(4):
            cols = [n * 8 + 2 * q + j for n in range(tn // 8) for j in range(2)]
            us = [u[c] for c in cols]
            best = min(us) if kind == "min" else max(us)
            if not (best <= thu if kind == "min" else best >= thu):
                continue
            for c, uc in zip(cols, us):
                v = _f32(uc + rb)
                if (v <= thr) if kind == "min" else (v >= thr):
                    if queue and len(queues[q]) < queue:
                        queues[q].insert(0, (v, cb + c))
                    else:
                        insert(lanes[q], (v, cb + c))
        if queue and (any(len(qq) >= max(queue // 2, 1) for qq in queues)
                      or (flush_rng is not None and flush_rng.random() < 0.5)):
            for q in range(4):
                for e in queues[q]:
                    insert(lanes[q], e)
                queues[q] = []
        cb += tn
    for q in range(4 if merge_flushes else 0):   # the merge's flush
        for e in queues[q]:
            insert(lanes[q], e)
    allc = sorted(sum(lanes, []), key=lambda e: ((e[0] if kind == "min" else -e[0]), e[1]))
    return allc[:k]


@pytest.mark.parametrize("kind", ["min", "max"])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [3, 10, 16])
def test_filter_model_is_exact(kind, seed, k):
    """The filter never drops an entry of the exact top-k (ties by index included): the model above
    against a sort of every (u + rb, index), on scores with many exact ties and a row bias large
    against the scores (rounding of u + rb)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    tn, tiles = 64, 40
    rb = _f32(rng.choice([0.0, 1e4, 3.7, -250.0]))
    u = rng.integers(-40, 40, size=(tiles, tn)).astype(np.float32) * _f32(rng.choice([0.25, 1e-3, 7.0]))
    if seed % 2:
        u += _f32(1e-4) * rng.standard_normal((tiles, tn)).astype(np.float32)
    if seed % 3 == 2:   # distinct scores, where a threshold below the row's k-th best would drop entries
        u = rng.standard_normal((tiles, tn)).astype(np.float32)
    every = [(_f32(u[t, c] + rb), t * tn + c) for t in range(tiles) for c in range(tn)]
    want = sorted(every, key=lambda e: ((e[0] if kind == "min" else -e[0]), e[1]))[:k]
    got = _filtered_row_topk(list(u), rb, k, kind)
    assert [(float(a), b) for a, b in got] == [(float(a), b) for a, b in want]
    for queue in (1, 2, 4):   # the deferred insertion, under a random flush schedule
        got = _filtered_row_topk(list(u), rb, k, kind, queue=queue, flush_rng=np.random.default_rng(seed + queue))
        assert [(float(a), b) for a, b in got] == [(float(a), b) for a, b in want], queue


def test_queue_model_loses_entries_without_the_final_flush():
    """The model's queue matters: with the merge's flush skipped (what E-TOPK-02 forbids), the scores
    still queued after the last tile are missing from the result."""
    import numpy as np
    last = np.full(64, 200.0, np.float32)
    last[9] = 0.5            # one passing score in the last tile: queued, no lane half full, no flush
    u = [np.full(64, 100.0, np.float32), np.arange(64, dtype=np.float32), last]
    got = _filtered_row_topk(u, _f32(0.0), 4, queue=4)
    assert [b for _, b in got] == [64, 128 + 9, 65, 66]
    lost = _filtered_row_topk(u, _f32(0.0), 4, queue=4, merge_flushes=False)
    assert [b for _, b in lost] == [64, 65, 66, 67]



@pytest.mark.parametrize("k", [10, 16, 32])
def test_filter_keeps_an_entry_between_the_quad_bounds(k):
    """Each lane holds ceil(k / 4) - 1 excellent scores (fewer than k in all), so the worst of the
    lanes' (ceil(k / 4) - 1)-th entries is below the row's k-th best: a later score between the two
    belongs to the top-k, and a bound one entry short of ceil(k / 4) would drop it."""
    import numpy as np
    r = -(-k // 4) - 1
    u0 = np.full(64, 1000.0, np.float32) + np.arange(64, dtype=np.float32)
    for q in range(4):
        for i in range(r):   # lane q's columns: n * 8 + 2 q + j
            u0[(i // 2) * 8 + 2 * q + (i % 2)] = float(q * 10 + i)
    u1 = np.full(64, 5000.0, np.float32)
    u1[9] = 500.0            # column 9: lane 0 (n = 1, j = 1)
    got = _filtered_row_topk([u0, u1], _f32(0.0), k)
    assert (500.0, 64 + 9) in [(float(a), b) for a, b in got]


def _scan_row_argmin(u_tiles, limit, kind="min"):
    """A model of the k = 1 lowering over an accumulator tile for one row (Emitter.topk1_acc): lane q of
    the quad scans its columns n * 8 + 2 q + j in increasing order with a strict compare (columns at or
    past `limit` skipped), enters its best with the exact (value, index) test into its running entry;
    the quad merges by the same test."""
    worst = 3e38 if kind == "min" else -3e38
    lanes = [(worst, -1)] * 4

    def better(a, b):
        return (a[0] < b[0] or (a[0] == b[0] and a[1] < b[1])) if kind == "min" else \
            (a[0] > b[0] or (a[0] == b[0] and a[1] < b[1]))
    cb = 0
    for u in u_tiles:
        tn = len(u)
        for q in range(4):
            bu, bc = (float("inf") if kind == "min" else float("-inf")), 0
            for c in (n * 8 + 2 * q + j for n in range(tn // 8) for j in range(2)):
                if cb + c < limit and ((u[c] < bu) if kind == "min" else (u[c] > bu)):
                    bu, bc = u[c], c
            if better((bu, cb + bc), lanes[q]):
                lanes[q] = (bu, cb + bc)
        cb += tn
    best = lanes[0]
    for e in lanes[1:]:
        best = e if better(e, best) else best
    return best


@pytest.mark.parametrize("kind", ["min", "max"])
@pytest.mark.parametrize("seed", range(6))
def test_argmin_scan_model_is_exact(kind, seed):
    """k = 1: the per-lane strict scan + one exact insertion per row and tile equals the exact argmin
    with ties broken by the smaller index, on scores with many exact ties and a limit inside a tile."""
    import numpy as np
    rng = np.random.default_rng(seed)
    tn, tiles = 64, 12
    u = rng.integers(-6, 6, size=(tiles, tn)).astype(np.float32)
    limit = int(rng.integers(tn * (tiles - 1) + 1, tn * tiles))
    got = _scan_row_argmin(list(u), limit, kind)
    flat = u.reshape(-1)[:limit]
    want_v = flat.min() if kind == "min" else flat.max()
    assert got == (want_v, int(np.flatnonzero(flat == want_v)[0]))


def test_supports_register_rule_agrees_with_the_verifier():
    """cakelib.variants.knn_registers_fit (a hand-kept sum of the search kernel's register tiles, the
    verifier asked only when that sum is over the budget) must accept exactly the kernels the verifier's
    E-RES-05 accepts, over every sweep variant and k, so the two cannot drift apart; knn_supports follows it
    wherever its k limits allow the variant (a register cap stops at KNN_CAPPED_K_MAX: it spills past it)."""
    import sys
    from pathlib import Path

    from cake_ir.verifier import verify
    from cakelib.variants import KNN_CAPPED_K_MAX, knn_kernel, knn_registers_fit, knn_supports, knn_tile_registers
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from lib_grid import knn_variants
    checked = refused = by_liveness = 0
    for p in knn_variants():
        for k in (1, 2, 8, 10, 16, 32):
            ir = knn_kernel(p, k, "l2", 128, "sm_90a")
            over = any(d.code == "E-RES-05" for d in verify(ir).diagnostics)
            assert knn_registers_fit(p, k, 128) == (not over), (p, k)
            shape = {"Q": 1 if p["split"] > 1 else 4096, "M": 1 << 20, "k": k}
            capped = p.get("minb", 1) > 1 and k > KNN_CAPPED_K_MAX
            assert knn_supports(p, shape) == (not over and not capped), (p, k)
            checked += 1
            refused += over
            by_liveness += not over and knn_tile_registers(p, k, 128) > 255
    assert checked > 200 and refused > 0 and by_liveness > 0    # the rule is exercised every way


def test_cakelib_knn_writes_caller_outputs_in_place():
    """out=: the kernel writes the caller's (poisoned) tensors, which come back; a wrong shape is refused."""
    torch = pytest.importorskip("torch")
    from cakelib import knn
    g = torch.Generator(device="cuda").manual_seed(3)
    xb = torch.randn(30_001, 128, device="cuda", generator=g).half()
    xq = xb[:5].clone()
    I0 = torch.full((5, 10), -7, dtype=torch.int32, device="cuda")
    D0 = torch.full((5, 10), float("nan"), device="cuda")
    I, Dv = knn(xq, xb, 10, variant=WS4, out=(I0, D0))
    assert I.data_ptr() == I0.data_ptr() and Dv.data_ptr() == D0.data_ptr()
    assert torch.equal(I[:, 0].cpu(), torch.arange(5, dtype=torch.int32))   # each query is a database row
    assert not torch.isnan(Dv).any() and (I >= 0).all()
    with pytest.raises(ValueError, match="shape"):
        knn(xq, xb, 10, out=(I0[:, :5], D0))



def test_supports_split_rule_agrees_with_the_builder():
    """knn_supports' hand-kept wide-merge rule (split a multiple of the last CTA's 32 * ws / wm thread
    groups) refuses exactly the variants knn_fused refuses to build, both ways."""
    from cakelib.variants import knn_kernel, knn_supports
    shape = {"Q": 1, "M": 1 << 20, "k": 10}
    refused = 0
    for bq, wm, ws in ((16, 16, 1), (64, 16, 1), (32, 32, 1), (16, 16, 4), (32, 32, 4)):
        for split in (2, 4, 6, 8, 12, 16, 24, 66, 128, 132):
            p = {"bq": bq, "bn": 32, "split": split, "stages": 3, "merge": "wide", "wm": wm, "ws": ws}
            try:
                knn_kernel(p, 10, "l2", 128, "sm_90a")
                built = True
            except ValueError:
                built = False
            assert knn_supports(p, shape) == built, p
            refused += not built
    assert refused > 5
