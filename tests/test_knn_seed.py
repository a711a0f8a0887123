"""The sampled starting bound (`seed` = F): a first kernel scores every F-th database tile and
stores each query's k-th best of that sample in its shared-bound word (`topk_bound` store); the search
loads the words before its first tile (`topk_bound` load) and filters from there. CPU: the Programs'
shape, verification, the lowering of both directions, the variant names. GPU (marked gpu): seeded
variants of every search family against float64, ties at the bound (a database of repeated rows), and
back-to-back launches (a seeded search must leave the words zeroed for the next one)."""
import numpy as np
import pytest

from test_knn_bound import search_near_and_far, wgmma_ok
from test_knn_fast import check_cakelib_knn, needs_gpu

from cake_ir.verifier import verify
from cake_ir.walk import statements
from tasks.knn.programs import knn_fused, seeded_bound
from tasks.knn.wgmma import knn_wgmma

WS4 = {"bq": 16, "bn": 32, "split": 128, "stages": 4, "merge": "wide", "ws": 4}
WG = {"mma": "wgmma", "bq": 128, "bn": 64, "stages": 4}


def _ops(kernel, op):
    return [s.node for s in statements(kernel) if getattr(s.node, "op", None) == op]


def _source(kernel) -> str:
    from cake_ir.lower import lower
    from cake_ir.passes import expand
    return lower(expand(kernel)[0]).source


BUILDS = [
    lambda seed: knn_fused("l2", k=16, bq=16, bn=32, split=128, stages=4, merge="wide", ws=4, seed=seed),
    lambda seed: knn_fused("ip", k=10, bq=64, bn=64, split=8, merge="serial", seed=seed),
    lambda seed: knn_fused("l2", k=10, bq=64, bn=64, split=1, norms="global", seed=seed),
    lambda seed: knn_wgmma("l2", k=16, bq=128, bn=64, split=16, stages=4, seed=seed),
    lambda seed: knn_wgmma("ip", k=32, bq=128, bn=64, split=1, stages=4, seed=seed)]


@pytest.mark.parametrize("make", BUILDS)
def test_seeded_program_samples_first_then_searches_from_the_bounds(make):
    plain, seeded = make(0), make(8)
    kernels = list(seeded.kernels)
    sample, search = kernels[-2], kernels[-1]
    assert sample.name.endswith("_smp8") and search.name.endswith("_sd8") and seeded.name == search.name
    base = plain.kernels[-1] if hasattr(plain, "kernels") else plain
    # the same first kernels (norms), one more kernel: the sample
    assert [k.name for k in kernels[:-2]] == [k.name for k in (plain.kernels[:-1] if hasattr(plain, "kernels") else [])]
    assert not [d for d in verify(seeded).diagnostics if d.severity == "error"]
    # the sample writes only the bounds: no result tensors, a store of each row's k-th best, no reset
    assert {"I", "Dist"}.isdisjoint(p.name for p in sample.params)
    assert [b.mode for b in _ops(sample, "topk_bound")] == ["store"]
    assert not [a for a in _ops(sample, "stg") if a.dst.buf in ("I", "Dist", "TH")]
    assert sample.consts["SF"] == 8
    # the search loads them before its database loop, filters with them and zeroes them at the end
    loads = _ops(search, "topk_bound")
    assert [b.mode for b in loads] == ["load"]
    top = [s for s in search.roles[0].body]
    assert top.index(next(s for s in top if getattr(s, "op", None) == "topk_bound")) < \
        top.index(next(s for s in top if getattr(s, "op", None) == "for"))
    assert all(t.given_bound is not None for t in _ops(search, "topk") if t.k > 1 and t.src_idx is None)
    assert [a for a in _ops(search, "stg") if a.dst.buf == "TH"], "the search must zero the bounds"
    assert [p.name for p in base.params] == [p.name for p in search.params]


def test_no_sample_at_k1_or_seed_0():
    assert not seeded_bound(1, 8) and not seeded_bound(16, 0) and seeded_bound(2, 4)
    one = knn_fused("l2", k=1, bq=16, bn=32, split=64, seed=8)
    assert not hasattr(one, "kernels") and not _ops(one, "topk_bound")
    assert knn_wgmma("l2", k=1, split=8, seed=8).kernels[-1].name == knn_wgmma("l2", k=1, split=8).kernels[-1].name


def test_sample_kernel_maps_its_tiles_to_every_fth_database_tile():
    """The sample's split arithmetic runs over MV = cdiv(M, F BN) BN sample rows; sample row v (a
    multiple of BN) is database row (v / BN) F BN, for the copies and the topk's column index alike; the
    limit is M (a chunk's tiles stay in the chunk)."""
    sample = knn_fused("l2", k=16, bq=16, bn=32, split=8, stages=4, merge="wide", seed=4).kernels[0]
    lets = {s.name: s.value for s in _ops(sample, "let")}
    assert lets["MV"] == "cdiv(M, SF * BN) * BN" and "MV" in lets["CH"] and "MV" in lets["nt"]
    topk = next(t for t in _ops(sample, "topk") if t.src_idx is None)
    assert topk.col == "((m0 + t * BN) / BN) * (SF * BN)" and topk.limit == "M"
    cps = [c for c in _ops(sample, "copy") if c.src.buf == "Xb"]
    assert cps and all("(SF * BN)" in str(c.src.offset[0]) for c in cps)


@pytest.mark.parametrize("wide", [True, False])
def test_sample_chunks_cover_each_sampled_tile_once(wide):
    """The sample kernel's chunk arithmetic, evaluated over (M, split, ws): the database rows its CTAs
    score are exactly the sampled tiles' rows below M, each once (a row scored twice would enter the merged
    list twice and make the stored k-th best tighter than the row's real one)."""
    from cake_ir import expr as E

    def ev(x, env):
        return E.evaluate(E.parse_index(x), env)
    for M, split, ws, F, bn in [(100_000, 8, 4, 8, 32), (1 << 20, 128, 4, 32, 32), (70_001, 8, 1, 4, 64),
                                (4099, 16, 1, 8, 64), (33, 2, 1, 4, 16)]:
        ws = ws if wide else 1     # (the stream's warps need the wide merge)
        kw = dict(bq=16, bn=bn, split=split, stages=4, merge="wide", ws=ws) if ws > 1 else \
            dict(bq=64, bn=bn, split=split, merge="wide" if wide else "serial")
        sample = knn_fused("l2", k=2, seed=F, **kw).kernels[0]
        lets = [s for s in _ops(sample, "let") if s.name in ("q0", "wq0", "rb", "MV", "s", "CH", "m0", "nt")]
        topk = next(t for t in _ops(sample, "topk") if t.src_idx is None)
        consts = dict(sample.consts)
        seen = []
        for by in range(split):
            for w in range(ws):
                env = {**consts, "M": M, "Q": 1, "bid.x": 0, "bid.y": by, "role_warp": w}
                for s in lets:
                    env[s.name] = ev(s.value, env)
                for t in range(env["nt"]):
                    c0 = ev(topk.col, {**env, "t": t})
                    seen += [c for c in range(c0, c0 + bn) if c < ev(topk.limit, env)]
        want = [r for j in range(-(-M // (F * bn))) for r in range(j * F * bn, j * F * bn + bn) if r < M]
        assert sorted(seen) == want, (M, split, ws, F, bn)


def test_lowering_loads_and_stores_the_words():
    prog = knn_fused("l2", k=10, bq=16, bn=32, split=8, stages=4, merge="wide", seed=8)
    search = _source(prog.kernels[-1])
    assert "gb[0] = cake::bound_value<true>((unsigned)__ldcg(" in search
    assert "gb[1] = cake::bound_value<true>((unsigned)__ldcg(" in search
    # the filter folds the given bound into the lists' own threshold, beside the shared one
    assert "fminf(fminf(cake::quad_min(cake_tv[9]), cake::quad_max(cake_tv[2])), gb[0])" in search
    assert "cake::bound_share_cached<true>(" in search
    assert "= (int)cake::bound_key<true>(mv[9]);" in _source(prog.kernels[0])
    unsplit = knn_wgmma("ip", k=16, bq=64, bn=64, split=1, stages=3, seed=8)
    src = _source(unsplit.kernels[-2])
    assert "if ((cake_lane & 3) == 0) *(TH + " in src and "cake::bound_key<false>(tv[15])" in src \
        and "cake::bound_key<false>(tv[31])" in src


def test_variant_names_and_registers_know_the_seed():
    from cakelib.variants import (_queue_table, knn_kernel, knn_name, knn_queue, knn_queue_key, knn_supports,
                                  knn_tile_registers)
    # a merge-kernel form keeps its base variant's fitted queue (the first A/B lost the k = 32 builds'
    # queue); a seeded form has an entry of its own (with the bound tight from the first tile
    # the queue that pays on the unseeded scan loses): some committed table variant has a fitted width
    from cakelib.dispatch import DispatchTable
    from cakelib.runtime import TABLES
    variants = DispatchTable.load(TABLES / "knn.json").variants
    fitted = [(p, int(kk)) for n, by_k in _queue_table().items() for kk, t in by_k.items() if int(t)
              for p in [variants.get(n)] if p is not None]
    assert fitted, "no committed kNN table variant has a fitted queue"
    for params, k in fitted:
        assert knn_queue(params, k) > 0 and knn_queue_key({**params, "seed": 8}) == knn_queue_key(params) + "_sd8"
        if params.get("merge") == "wide":
            assert knn_queue({**params, "merge": "kernel"}, k) == knn_queue(params, k)
    seeded = [n for n in _queue_table() if n.endswith("_sd8")]
    assert seeded and any(not t for n in seeded for t in _queue_table()[n].values())   # measured, and not all queued
    p = {"bq": 128, "bn": 64, "split": 1, "stages": 4, "mma": "wgmma"}
    assert knn_name({**p, "seed": 8}) == knn_name(p) + "_sd8"
    q0 = {**p, "queue": 0}   # (the seeded form keeps its own queue entry: compare at one queue width)
    assert knn_tile_registers({**q0, "seed": 8}, 16, 128) == knn_tile_registers(q0, 16, 128) + 2
    assert knn_tile_registers({**q0, "seed": 8}, 1, 128) == knn_tile_registers(q0, 1, 128)
    assert knn_supports({**p, "seed": 8}, {"Q": 65536, "M": 65536, "k": 16, "D": 128})
    assert knn_kernel({**p, "seed": 8}, 16, "l2", 128, "sm_90a").kernels[-1].name.endswith("_sd8")


def test_sampled_bound_tactic_is_in_the_families():
    from tasks.knn.programs import FAMILIES
    from tactics.base import get_tactic, retrieve
    for fam in FAMILIES.values():
        assert fam["tactics"]["topk_sampled_bound"] == ["seed"] and 0 in fam["space"]["seed"]
    assert get_tactic("topk_sampled_bound") is not None
    names = [t.name for t in retrieve("every split starts its top-k list empty and inserts its first candidates; "
                                      "start from a threshold sampled from the database", k=3)]
    assert "topk_sampled_bound" in names


# ------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric,Q,M,k,variant", [
    ("l2", 1, 1_000_003, 16, {**WS4, "seed": 8}), ("ip", 3, 300_001, 10, {**WS4, "seed": 32}),
    ("l2", 37, 200_001, 16, {"bq": 16, "bn": 32, "split": 128, "stages": 4, "norms": "global", "merge": "wide",
                             "seed": 8}),
    ("l2", 50, 70_001, 10, {"bq": 64, "bn": 64, "split": 8, "stages": 2, "merge": "serial", "seed": 4}),
    ("l2", 1000, 50_001, 32, {"bq": 64, "bn": 64, "split": 1, "stages": 2, "norms": "global", "seed": 8}),
    ("l2", 129, 500_001, 16, {**WG, "split": 64, "merge": "wide", "seed": 8}),
    ("ip", 300, 100_003, 32, {**WG, "split": 16, "merge": "wide", "queue": 4, "seed": 32}),
    ("l2", 3000, 40_003, 16, {**WG, "split": 1, "minb": 2, "seed": 8}),
    ("l2", 200, 90_001, 16, {**WG, "bq": 64, "split": 8, "merge": "wide", "overlap": True, "seed": 8})])
def test_seeded_variants_match_float64_on_gpu(metric, Q, M, k, variant):
    if not wgmma_ok(variant):
        pytest.skip("wgmma needs sm_90a")
    check_cakelib_knn(metric, Q, M, k, variant, seed=19)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("variant", [{**WS4, "seed": 8}, {**WG, "split": 1, "seed": 8},
                                     {**WG, "split": 16, "merge": "wide", "seed": 4}])
def test_ties_at_the_sampled_bound_on_gpu(variant):
    """A database of 500 distinct rows repeated: every sampled k-th best ties with many rows outside the
    sample (the filter must pass a score equal to the bound), and the k best are all ties."""
    if not wgmma_ok(variant):
        pytest.skip("wgmma needs sm_90a")
    from cakelib import knn
    rng = np.random.default_rng(23)
    Q, M, k = 70, 120_007, 16
    xq = rng.standard_normal((Q, 128)).astype(np.float16)
    base = rng.standard_normal((500, 128)).astype(np.float16)
    xb = np.ascontiguousarray(np.resize(base, (M, 128)))
    I, Dv = knn(xq, xb, k, variant=variant)
    I = np.asarray(I).astype(np.int64)
    s = (xq.astype(np.float64) ** 2).sum(1)[:, None] + (xb[:500].astype(np.float64) ** 2).sum(1)[None] \
        - 2 * xq.astype(np.float64) @ xb[:500].astype(np.float64).T
    best = np.sort(s, 1)[:, 0]          # every query's nearest distinct row has M / 500 copies >= k
    got = np.take_along_axis(s, I % 500, 1)
    assert (I >= 0).all() and (I < M).all()
    assert np.allclose(got, best[:, None], rtol=1e-3, atol=1e-2)
    assert all(len(set(r)) == k for r in I.tolist())


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("variant", [{**WS4, "seed": 8}, {**WG, "split": 1, "seed": 8},
                                     {**WG, "split": 16, "merge": "wide", "seed": 8}])
def test_seeded_bounds_do_not_leak_into_the_next_launch(variant):
    """A seeded search on a database near the queries, then the same variant unseeded and seeded on one far
    from them: a word left set would drop every true neighbour of the later searches."""
    if not wgmma_ok(variant):
        pytest.skip("wgmma needs sm_90a")
    unseeded = {kk: v for kk, v in variant.items() if kk != "seed"}
    search_near_and_far("l2", [("near", variant), ("far", unseeded), ("near", variant), ("far", variant)], seed=29)
