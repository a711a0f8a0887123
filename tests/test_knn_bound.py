"""The shared top-k bound (`topk` shared_bound): the CTAs that split a query's database
publish and read a bound of its k-th best. CPU: the builders' use of it (E-TOPK-03 clean, the reset),
the lowering, and the runtime's order-preserving key compiled for the host. GPU (marked gpu): variants
with the bound against float64, and back-to-back launches on different data (a bound left over from
the first launch would drop the second's true neighbours)."""
import re
import shutil
import subprocess

import numpy as np
import pytest

from test_knn_fast import needs_gpu

from cake_ir.lower.emit import header_text
from cake_ir.verifier import verify
from tasks.knn.programs import knn_fused, shares_bound
from tasks.knn.wgmma import knn_wgmma

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def _search(ir):
    return ir.kernels[-1] if hasattr(ir, "kernels") else ir


def _topks(kernel):
    from cake_ir.walk import statements
    return [s.node for s in statements(kernel) if getattr(s.node, "op", None) == "topk"
            and getattr(s.node, "shared_bound", None) is not None]


@pytest.mark.parametrize("make", [
    lambda share: knn_fused("l2", k=16, bq=16, bn=32, split=128, stages=4, merge="wide", ws=4, share=share),
    lambda share: knn_fused("ip", k=10, bq=64, bn=64, split=8, merge="serial", share=share),
    lambda share: knn_wgmma("l2", k=16, bq=128, bn=64, split=16, stages=4, share=share)])
def test_split_builders_share_and_reset_the_bound(make):
    on, off = _search(make(True)), _search(make(False))
    assert on.name.endswith("_sb") and not off.name.endswith("_sb")
    assert len(_topks(on)) == 1 and not _topks(off)
    assert not [d for d in verify(make(True)).diagnostics if d.severity == "error"]
    from cake_ir.walk import statements
    resets = [s.node for s in statements(on) if getattr(s.node, "op", None) == "stg" and s.node.dst.buf == "TH"]
    assert resets, "the last CTA must zero the bounds"


def test_no_bound_without_a_split_or_at_k1():
    assert not shares_bound(16, 1) and not shares_bound(1, 128) and shares_bound(2, 2) and shares_bound(10, 1, ws=4)
    assert not _topks(_search(knn_fused("l2", k=16, split=1)))
    assert not _topks(_search(knn_fused("l2", k=1, bq=16, bn=32, split=64)))


def _source(kernel) -> str:
    from cake_ir.lower import lower
    from cake_ir.passes import expand
    return lower(expand(kernel)[0]).source


def test_lowering_reads_and_publishes_the_bound():
    """The builders keep the bound as last read (bound_cache): the read for the next tile is issued in
    this one; without the cache the read is synchronous."""
    src = _source(_search(knn_fused("l2", k=16, bq=16, bn=32, split=8, merge="wide", share=True)))
    assert "cake::bound_share_cached<true>(" in src
    assert "cake::bound_share_cached<false>(" in _source(_search(knn_wgmma("ip", k=10, bq=64, bn=64, split=8,
                                                                           stages=3)))
    assert "cake::bound_share" not in _source(_search(knn_fused("l2", k=16, bq=16, bn=32, split=8, share=False)))
    k = _search(knn_fused("l2", k=16, bq=16, bn=32, split=8, merge="wide"))
    _topks(k)[0].bound_cache = None
    assert "cake::bound_share<true>(" in _source(k)


def test_rule_wants_a_filled_cache_beside_a_shared_bound():
    k = _search(knn_fused("l2", k=16, bq=16, bn=32, split=8, merge="wide"))
    fill = next(s for s in k.roles[0].body if getattr(s, "op", None) == "fill" and s.dst.buf == "bc")
    k.roles[0].body.remove(fill)
    hits = [d for d in verify(k).diagnostics if d.code == "E-TOPK-03"]
    assert hits and "not filled" in hits[0].message and hits[0].node.endswith("/bound_cache")
    k = _search(knn_fused("l2", k=16, bq=16, bn=32, split=8, merge="wide"))
    _topks(k)[0].shared_bound = None
    hits = [d for d in verify(k).diagnostics if d.code == "E-TOPK-03"]
    assert hits and "give the topk shared_bound" in hits[0].message


def _key_source() -> str:
    h = header_text()
    m = re.search(r"template <bool MIN> __device__ __forceinline__ unsigned bound_key.*?\n}\n"
                  r"template <bool MIN> __device__ __forceinline__ float bound_value.*?\n}\n", h, re.S)
    assert m, "bound_key / bound_value not found in cake.cuh"
    return m.group(0)


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_bound_key_orders_like_the_selection_and_zero_is_no_bound(tmp_path):
    """For min the key grows as the value falls (an atomic max keeps the smallest bound), for max as it
    grows; the key round-trips; the word 0 reads as NaN, which fminf / fmaxf ignore."""
    src = tmp_path / "key.cpp"
    src.write_text(f"""#include <cstdio>
#include <cstring>
#define __device__
#define __forceinline__ inline
static unsigned __float_as_uint(float f) {{ unsigned u; std::memcpy(&u, &f, 4); return u; }}
static float __uint_as_float(unsigned u) {{ float f; std::memcpy(&f, &u, 4); return f; }}
namespace cake {{
{_key_source()}
}}
int main() {{
  float f;
  while (scanf("%f", &f) == 1)
    printf("%u %u %.9g %.9g\\n", cake::bound_key<true>(f), cake::bound_key<false>(f),
           cake::bound_value<true>(cake::bound_key<true>(f)), cake::bound_value<false>(cake::bound_key<false>(f)));
  printf("%.9g %.9g\\n", cake::bound_value<true>(0u), cake::bound_value<false>(0u));
}}
""")
    exe = tmp_path / "key"
    subprocess.run([CXX, "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    rng = np.random.default_rng(5)
    xs = np.concatenate([rng.standard_normal(300) * 10.0 ** rng.integers(-30, 30, 300),
                         [0.0, -0.0, 3.0e38, -3.0e38, 1e-45, -1e-45, np.inf, -np.inf]]).astype(np.float32)
    inp = "\n".join(f"{x!r}" if np.isfinite(x) else ("inf" if x > 0 else "-inf") for x in xs.tolist())
    out = subprocess.run([str(exe)], input=inp, capture_output=True, text=True, check=True).stdout.split("\n")
    rows = [line.split() for line in out[:len(xs)]]
    kmin = np.array([int(r[0]) for r in rows], dtype=np.uint64)
    kmax = np.array([int(r[1]) for r in rows], dtype=np.uint64)
    back = np.array([[float(r[2]), float(r[3])] for r in rows], dtype=np.float32)
    assert (back[:, 0] == xs).all() and (back[:, 1] == xs).all()
    assert (kmin > 0).all() and (kmax > 0).all()
    for i in range(len(xs)):
        lt = xs < xs[i]
        assert (kmin[lt] > kmin[i]).all() and (kmax[lt] < kmax[i]).all(), xs[i]
    nan_min, nan_max = out[len(xs)].split()
    assert nan_min.lower().endswith("nan") and nan_max.lower().endswith("nan")


WS4 = {"bq": 16, "bn": 32, "split": 128, "stages": 4, "merge": "wide", "ws": 4}
WG = {"mma": "wgmma", "bq": 128, "bn": 64, "stages": 4, "merge": "wide"}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric,Q,M,k,variant", [
    ("l2", 1, 1_000_003, 16, WS4), ("ip", 3, 300_001, 10, WS4),
    ("l2", 37, 200_001, 16, {"bq": 16, "bn": 32, "split": 128, "stages": 4, "norms": "global", "merge": "wide"}),
    ("l2", 50, 70_001, 10, {"bq": 64, "bn": 64, "split": 8, "stages": 2, "merge": "serial"}),
    ("l2", 129, 500_001, 16, {**WG, "split": 64}), ("ip", 300, 100_003, 32, {**WG, "split": 16, "queue": 4}),
    ("l2", 200, 90_001, 16, {**WG, "bq": 64, "split": 8, "overlap": True})])
def test_shared_bound_variants_match_float64_on_gpu(metric, Q, M, k, variant):
    from gpu_backend.driver import arch_of, properties
    if variant.get("mma") == "wgmma" and arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    from test_knn_fast import check_cakelib_knn
    check_cakelib_knn(metric, Q, M, k, {**variant, "share": True}, seed=13)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("variant", [WS4, {**WG, "split": 16}])
def test_bounds_do_not_leak_into_the_next_launch(metric, variant):
    """A first search on a database close to the queries publishes tight bounds; the second, on one
    far from them, finds every score worse than those bounds: unless the last CTA reset them, it
    returns nothing right. Both must match float64."""
    from gpu_backend.driver import arch_of, properties
    if variant.get("mma") == "wgmma" and arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    v = {**variant, "share": True}
    search_near_and_far(metric, [("near", v), ("far", v), ("near", v)], seed=3)


def wgmma_ok(variant) -> bool:
    """The variant runs on this GPU (the wgmma ones need sm_90a)."""
    from gpu_backend.driver import arch_of, properties
    return variant.get("mma") != "wgmma" or arch_of(properties(0)) == "sm_90a"


def search_near_and_far(metric: str, runs: list, seed: int, Q: int = 40, M: int = 200_003, k: int = 16) -> None:
    """Searches, one after the other, of the same queries against a database near them ("near": copies
    plus 0.01 noise) or far from them ("far": -3x copies plus noise), each with its variant (`runs`: (which,
    variant) pairs); each result must match float64: a bound word or partial list left over from an earlier
    launch would filter out or replace a later one's true neighbours."""
    from cakelib import knn
    rng = np.random.default_rng(seed)
    xq = rng.standard_normal((Q, 128)).astype(np.float16)
    dbs = {"near": (np.repeat(xq, M // Q + 1, 0)[:M] + 0.01 * rng.standard_normal((M, 128))).astype(np.float16),
           "far": (-3.0 * np.repeat(xq, M // Q + 1, 0)[:M] + rng.standard_normal((M, 128))).astype(np.float16)}
    for which, variant in runs:
        db = dbs[which]
        I, Dv = knn(xq, db, k, metric=metric, variant=variant)
        s = xq.astype(np.float64) @ db.astype(np.float64).T
        if metric == "l2":
            s = (xq.astype(np.float64) ** 2).sum(1)[:, None] + (db.astype(np.float64) ** 2).sum(1)[None] - 2 * s
            kth = np.sort(s, 1)[:, k - 1]
            got = np.take_along_axis(s, np.asarray(I).astype(np.int64), 1)
            assert (got <= kth[:, None] * (1 + 1e-3) + 1e-2).all()
        else:
            kth = -np.sort(-s, 1)[:, k - 1]
            got = np.take_along_axis(s, np.asarray(I).astype(np.int64), 1)
            assert (got >= kth[:, None] - 1e-3 * np.abs(kth[:, None]) - 1e-2).all()
        assert (np.asarray(I) >= 0).all()


def test_padded_rows_never_enter_the_insertion():
    """skip_pad (default): the search's topk names the valid rows of its tile, the lowering makes a
    padding row's best score the worst (its lanes stay for the shuffles); off, no such test."""
    k = _search(knn_fused("l2", k=16, bq=16, bn=32, split=8, merge="wide"))
    sel = next(s for s in k.roles[0].body[::-1] if getattr(s, "op", None) == "for").body
    topk = next(s for s in sel if getattr(s, "op", None) == "topk")
    assert topk.valid_rows == "Q - q0 - wq0"
    src = _source(k)
    for row in ("0", "8"):   # a lane's two rows of the warp's 16
        assert f"if (!(({row} + (cake_lane >> 2)) < (int)(Q - q0 - wq0))) cake_best = cake::inf();" in src
    off = _search(knn_fused("l2", k=16, bq=16, bn=32, split=8, merge="wide", skip_pad=False))
    assert "cake_best = cake::inf();" not in _source(off)
    wg = _search(knn_wgmma("ip", k=10, bq=64, bn=64, split=8, stages=3))
    assert "cake_best = (-cake::inf());" in _source(wg)
    assert not _topks(_search(knn_fused("l2", k=1, bq=16, bn=32, split=8))) and \
        "cake_best = cake::inf();" not in _source(_search(knn_fused("l2", k=1, bq=16, bn=32, split=8)))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric,Q,M,k,variant", [
    ("l2", 1, 300_001, 16, WS4), ("ip", 5, 100_003, 10, {"bq": 16, "bn": 64, "split": 64, "stages": 2,
                                                        "merge": "wide", "ws": 4}),
    ("l2", 37, 70_001, 16, {"bq": 64, "bn": 64, "split": 1, "stages": 2, "norms": "global"}),
    ("ip", 70, 100_003, 16, {**WG, "split": 16})])
def test_padded_rows_skipped_match_float64_on_gpu(metric, Q, M, k, variant):
    from gpu_backend.driver import arch_of, properties
    if variant.get("mma") == "wgmma" and arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    from test_knn_fast import check_cakelib_knn
    check_cakelib_knn(metric, Q, M, k, {**variant, "skip_pad": True}, seed=17)


def test_shared_bound_family_tactic_toggles_the_bound():
    """The search proposer's way to the bound: the family tactic re-instantiates the split seed with
    share off (its default is on); both programs verify clean, only the shared one has the bound."""
    import json
    from cake_ir.io import load
    from tactics.base import get_tactic
    from tasks.registry import get
    from tactics.family import family, instantiate
    tac = get_tactic("topk_shared_bound")
    seed = {x["name"]: x for x in get("knn").seed_genomes()}["knn_l2_mma_sm80"]
    recipe = {**seed["recipe"], "params": {**seed["recipe"]["params"], "bq": 16, "bn": 32, "split": 64,
                                           "merge": "wide"}}
    g = {"name": "split", "ir": instantiate(family(recipe), recipe["params"]), "recipe": recipe}
    assert {"share": False} in tac.choices(g)
    out = tac.apply(g, {"share": False})
    k, _ = load(out["ir"])
    assert verify(k).ok and '"shared_bound"' not in json.dumps(out["ir"])
    assert '"shared_bound"' in json.dumps(g["ir"])


def test_shared_bound_tactic_is_found_by_its_problem():
    from tactics.base import retrieve
    names = [t.name for t in retrieve("each CTA of a database split inserts its own top-k candidates; share a "
                                      "threshold bound between the splits", k=3)]
    assert "topk_shared_bound" in names


def test_rule_wants_valid_rows_on_the_filtered_topk_only():
    k = _search(knn_fused("l2", k=1, bq=16, bn=32, split=8))
    loop = next(s for s in k.roles[0].body if getattr(s, "op", None) == "for")
    topk = next(s for s in loop.body if getattr(s, "op", None) == "topk")
    topk.valid_rows = "Q - q0"
    hits = [d for d in verify(k).diagnostics if d.code == "E-TOPK-03"]
    assert hits and hits[0].node.endswith("/valid_rows") and "k > 1" in hits[0].message
