"""The wide k-means family (tasks/kmeans/wide.py: norms, streamed-chunk assignment + global scatter,
finalize) for K up to 65536 and D a multiple of 32 in [32, 1024]. CPU: every kernel the rule picks at
D in {32, 96, 768, 1024} and K in {1024, 65536} verifies without errors and compiles without spills, the
mma.sync form for sm_90a and sm_80 and the wgmma form for sm_90a (the two-CTA wgmma form the bench times
beside it too); the dispatch rule and its domain errors; the float64 reference check itself. GPU (marked):
cakelib.kmeans in each form against a float64 numpy Lloyd iteration from the same centroids (inertia within
1e-3, centroids the means of the own assignment), after 1 and 3 iterations."""
import numpy as np
import pytest

from cake_ir.compiler import compile_ir
from cake_ir.verifier import verify
from cakelib.variants import (kmeans_family, kmeans_name, kmeans_wide_domain_error, kmeans_wide_kernels,
                              kmeans_wide_params, kmeans_wide_supports)
from tasks.kmeans import wide

ARCHS = ["sm_90a", "sm_80"]


def _errors(k):
    return [d.short() for d in verify(k).diagnostics if d.severity == "error" or d.code == "N-SYN-01"]


def _compiles(k, arch):
    r = compile_ir(k, arch=arch)
    assert r.ok, [d.short() for d in r.diagnostics if d.severity == "error"]
    notes = [d.message for d in r.diagnostics if d.code == "N-BACKEND-RESOURCES"]
    assert notes and "0 B spill stores" in notes[0], notes


@pytest.mark.parametrize("mma", ["sync", "wgmma"])
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("D", [32, 96, 768, 1024])
def test_wide_kernels_verify_and_compile(D, arch, mma):
    if mma == "wgmma" and arch != "sm_90a":
        with pytest.raises(ValueError, match="sm_90a"):
            wide.kmeans_wide_assign_wgmma(D, arch=arch)
        assert not kmeans_wide_supports(kmeans_wide_params({"B": 1, "N": 1 << 20, "K": 1024, "D": D, "arch": "sm_90a"}),
                                        {"B": 1, "N": 1 << 20, "K": 1024, "D": D, "arch": arch})
        return
    picks = [kmeans_wide_params({"B": 1, "N": 1 << 20, "K": K, "D": D, "arch": arch}, mma) for K in (4096, 65536)]
    assert picks[0] == picks[1]     # K enters the rule through the copies (from N / K = 4096) and up to K = 2048
    p = kmeans_wide_params({"B": 1, "N": 1 << 20, "K": 65536, "D": D, "arch": arch}, mma)
    assert p["mma"] == mma
    for K in (1024, 65536):
        assert kmeans_wide_supports(p, {"B": 2, "N": 1 << 20, "K": K, "D": D, "arch": arch})
    for part, build in kmeans_wide_kernels(p, D, arch).items():
        if part != "assign" and mma == "wgmma":
            continue        # the norms and finalize kernels are the same for both forms
        k = build()
        assert not _errors(k), (part, _errors(k))
        _compiles(k, arch)


B2 = {"kind": "wide", "mma": "wgmma", "bm": 128, "bn": 128, "dc": 64, "stages": 2, "minb": 2}   # bench's A/B form


@pytest.mark.parametrize("D", [32, 96, 256])
def test_two_cta_wgmma_form_verifies_and_compiles(D):
    """Two CTAs of 128 points per SM (minb 2: 128 registers per thread; a few bytes of spill at most)."""
    assert kmeans_name(B2).endswith("_wg_b2")
    assert kmeans_wide_supports(B2, {"B": 1, "N": 1 << 20, "K": 65536, "D": D, "arch": "sm_90a"})
    k = kmeans_wide_kernels(B2, D, "sm_90a")["assign"]()
    assert not _errors(k), _errors(k)
    r = compile_ir(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics if d.severity == "error"]
    note = next(d.message for d in r.diagnostics if d.code == "N-BACKEND-RESOURCES")
    assert "128 registers" in note and int(note.split(" B spill stores")[0].rsplit(" ", 1)[1]) <= 32, note
    assert not kmeans_wide_supports(B2, {"B": 1, "N": 1 << 20, "K": 1024, "D": 512, "arch": "sm_90a"})
    with pytest.raises(ValueError, match="minb"):
        wide.kmeans_wide_assign_wgmma(512, bm=128, stages=2, minb=2)


STREAMED = {"kind": "wide", "mma": "wgmma", "points": "streamed", "dc": 64, "bm": 128, "bn": 128, "stages": 4,
            "red": 4}


@pytest.mark.parametrize("D", [32, 96, 768, 1024])
@pytest.mark.parametrize("form", [STREAMED, {**STREAMED, "stages": 3, "minb": 2, "red": 1},
                                  {**STREAMED, "bn": 256, "stages": 3}])
def test_streamed_and_vector_red_forms_verify_and_compile(D, form):
    """The streamed form (points and centroids through one ring, tasks/kmeans/wide_streamed.py) with scalar
    and vector reds verifies and compiles without spills at any D; vector reds lower to red.global.add.v4."""
    assert kmeans_name(form).startswith(f"kmeans_wide_bm128_bn{form['bn']}") and "_st" in kmeans_name(form)
    assert kmeans_wide_supports(form, {"B": 1, "N": 1 << 20, "K": 65536, "D": D, "arch": "sm_90a"})
    assert not kmeans_wide_supports(form, {"B": 1, "N": 1 << 20, "K": 1024, "D": D, "arch": "sm_80"})
    k = kmeans_wide_kernels(form, D, "sm_90a")["assign"]()
    assert not _errors(k), _errors(k)
    r = compile_ir(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics if d.severity == "error"]
    assert "0 B spill stores" in next(d.message for d in r.diagnostics if d.code == "N-BACKEND-RESOURCES")
    assert ("cake::red_add_global_v4(" in r.cuda_source) == (form.get("red", 1) == 4)


TMA = {"kind": "wide", "mma": "wgmma", "points": "tma", "dc": 64, "bm": 128, "bn": 256, "stages": 4, "red": 4}


@pytest.mark.parametrize("D", [64, 96, 768, 1024])
@pytest.mark.parametrize("form", [TMA, {**TMA, "bn": 128, "stages": 6, "copies": 4}, {**TMA, "bm": 64, "red": 1}])
def test_tma_form_verifies_and_compiles(D, form):
    """The warp-specialized form (tasks/kmeans/wide_tma.py): a TMA producer warpgroup, bm / 64 consumer
    warpgroups synchronising the norms on their own named barrier; no spills at any D, sm_90a only, and a
    ring that does not fit is refused with the shared memory it needs."""
    name = kmeans_name(form)
    assert name.endswith("_tma" + (f"_r{form['red']}" if form["red"] > 1 else "")
                         + (f"_p{form['copies']}" if form.get("copies", 1) > 1 else ""))
    assert kmeans_wide_supports(form, {"B": 1, "N": 1 << 20, "K": 65536, "D": D, "arch": "sm_90a"})
    assert not kmeans_wide_supports(form, {"B": 1, "N": 1 << 20, "K": 1024, "D": D, "arch": "sm_80"})
    k = kmeans_wide_kernels(form, D, "sm_90a")["assign"]()
    assert not _errors(k), _errors(k)
    assert k.launch.threads == 128 + 2 * form["bm"]
    r = compile_ir(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics if d.severity == "error"]
    assert "0 B spill stores" in next(d.message for d in r.diagnostics if d.code == "N-BACKEND-RESOURCES")
    assert "cake::tma_load_2d(" in r.cuda_source and f"cake::bar_sync(1, {2 * form['bm']})" in r.cuda_source
    assert not kmeans_wide_supports({**form, "stages": 8, "bn": 256}, {"B": 1, "N": 4096, "K": 512, "D": D})
    with pytest.raises(ValueError, match="shared memory"):
        kmeans_wide_kernels({**form, "stages": 8, "bn": 256}, D, "sm_90a")["assign"]()


@pytest.mark.parametrize("D", [96, 1024])
@pytest.mark.parametrize("form", [{**TMA, "cluster": 2}, {**TMA, "bm": 64, "cluster": 2},
                                  {**TMA, "bn": 128, "stages": 6, "cluster": 2}])
def test_tma_form_in_cta_pairs_multicasts_the_centroids(D, form):
    """cluster 2: CTA pairs (__cluster_dims__(2, 1, 1), the grid rounded up to even), each CTA's producer loads
    half of the centroid atom's rows multicast into both CTAs, a consumer warp's release arrives on the slot's
    empty barrier in both (which count both CTAs' consumer warps), the barriers initialised before a cluster
    barrier and a cluster barrier before exit. The verifier's symmetric-cluster model balances the bytes and
    arrivals (no E-SYN errors)."""
    assert kmeans_name(form).endswith("_tma_cl2_r4") and kmeans_wide_supports(form, {"B": 1, "N": 10, "K": 8, "D": D})
    k = kmeans_wide_kernels(form, D, "sm_90a")["assign"]()
    assert not _errors(k), _errors(k)
    assert k.launch.cluster == [2, 1] and k.launch.grid[0] == "cdiv(N, BM * 2) * 2"
    r = compile_ir(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics if d.severity == "error"]
    assert "0 B spill stores" in next(d.message for d in r.diagnostics if d.code == "N-BACKEND-RESOURCES")
    src = r.cuda_source.split('extern "C"')[-1]
    assert "__cluster_dims__(2, 1, 1)" in src and src.count("cake::cluster_sync();") == 2
    assert "cake::tma_load_2d_mc(" in src and "(unsigned short)3u" in src and "cake::tma_load_2d(" in src
    assert "cake_cta < 2u; ++cake_cta) cake::mbar_arrive_cluster(" in src
    assert f"), {2 * form['bm'] // 16}u);" in src    # the empty barriers: both CTAs' consumer warps
    with pytest.raises(ValueError, match="cluster 1 or 2"):
        kmeans_wide_kernels({**form, "cluster": 4}, D, "sm_90a")["assign"]()


def test_vector_reds_need_sm_90a():
    p = {**kmeans_wide_params({"B": 1, "N": 1 << 20, "K": 1024, "D": 128, "arch": "sm_80"}), "red": 4}
    assert not kmeans_wide_supports(p, {"B": 1, "N": 1 << 20, "K": 1024, "D": 128, "arch": "sm_80"})
    with pytest.raises(ValueError, match="red"):
        wide.kmeans_wide_assign(128, arch="sm_80", red=4)
    k = wide.kmeans_wide_assign(128, arch="sm_90a", red=2)
    assert not _errors(k), _errors(k)
    assert "cake::red_add_global_v2(" in compile_ir(k, arch="sm_90a").cuda_source


@pytest.mark.parametrize("D", [64, 1024])
@pytest.mark.parametrize("form", [{**TMA, "pt": 4}, {**TMA, "bm": 64, "pt": 2, "copies": 2}])
def test_tma_form_over_point_tiles_scatters_behind(D, form):
    """pt > 1: a CTA runs pt consecutive point tiles (grid cdiv(N, BM PT)); the consumers hand each tile's
    assignments to the producer warpgroup through two smem slots (mbarriers counting the consumer warps and
    the three scatter warps), whose warps 1-3 scatter the tile while the consumers run the next one."""
    assert kmeans_name(form).endswith(f"_tma_t{form['pt']}_r4" + ("_p2" if form.get("copies") else ""))
    assert kmeans_wide_supports(form, {"B": 1, "N": 10, "K": 8, "D": D})
    assert not kmeans_wide_supports({**form, "cluster": 2}, {"B": 1, "N": 10, "K": 8, "D": D})
    k = kmeans_wide_kernels(form, D, "sm_90a")["assign"]()
    assert not _errors(k), _errors(k)
    assert k.launch.grid[0] == "cdiv(N, BM * PT)" and k.consts["PT"] == form["pt"]
    r = compile_ir(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics if d.severity == "error"]
    assert "0 B spill stores" in next(d.message for d in r.diagnostics if d.code == "N-BACKEND-RESOURCES")
    src = r.cuda_source.split('extern "C"')[-1]
    if form["bm"] == 128:          # (at 256 threads the launch cap, 255, leaves nothing to move)
        assert "setmaxnreg_dec<88>" in src and "setmaxnreg_inc<208>" in src
    assert src.count("cake::red_add_global_v4(") == 2 and "if (grp % 3 == cake_role_warp - 1)" in src
    assert src.count("cake::mbar_init(") == 4 + 2 * form["stages"]
    # the handed-over assignments load as ints (not through a float, which rounds past 2^24)
    assert "si[0 + cake_c] = (*reinterpret_cast<const int*>(" in src
    with pytest.raises(ValueError, match="pt"):
        kmeans_wide_kernels({**form, "pt": 3}, D, "sm_90a")["assign"]()


@pytest.mark.parametrize("D,sb", [(1024, 8), (768, 8), (96, 2), (800, 2)])
def test_tma_form_batches_the_scatter_loads(D, sb):
    """sb: a scatter slice of sb groups of 4-float reds per lane, every group's point loads before the first
    red (the reds are asm with a memory clobber: loads between them would wait out a round trip each); the
    rule takes the largest of 8 / 4 / 2 that divides D into 16 sb slices."""
    form = {**TMA, "sb": sb}
    assert kmeans_name(form).endswith(f"_sb{sb}") and kmeans_wide_supports(form, {"B": 1, "N": 10, "K": 8, "D": D})
    assert not kmeans_wide_supports({**form, "sb": 16 * sb}, {"B": 1, "N": 10, "K": 8, "D": D})
    if D >= 768:
        assert kmeans_wide_params({"B": 1, "N": 4096, "K": 64, "D": D, "arch": "sm_90a"}, sorted_sums=False)["sb"] == sb
        assert "sb" not in kmeans_wide_params({"B": 1, "N": 4096, "K": 64, "D": D, "arch": "sm_90a"},
                                              batched_scatter=False, sorted_sums=False)
    k = kmeans_wide_kernels(form, D, "sm_90a")["assign"]()
    assert not _errors(k), _errors(k)
    r = compile_ir(k, arch="sm_90a")
    assert r.ok and "0 B spill stores" in next(d.message for d in r.diagnostics if d.code == "N-BACKEND-RESOURCES")
    src = r.cuda_source.split('extern "C"')[-1]
    body = src[src.index(f"float cake_x[{sb}][4];"):]
    assert body.index("cake_x[cake_i][3] = ") < body.index("cake::red_add_global_v4(")
    with pytest.raises(ValueError, match="sb"):
        kmeans_wide_kernels({**form, "red": 1}, D, "sm_90a")["assign"]()


@pytest.mark.parametrize("form", ["sync", "wgmma", "paired", "streamed", "tma"])
def test_scatter_vector_loads_verify_and_compile(form):
    """lv: the scatter reads each red.v4's four halves with one 8-byte load where they are contiguous and aligned
    (cake::ld_u16x4 tests the addresses), from the smem tile (sync / wgmma / paired) or global memory (streamed,
    tma); the same registers as without it, no spill beyond the form's own."""
    D = 768 if form in ("streamed", "tma") else 128
    base = kmeans_wide_params({"B": 1, "N": 1 << 20, "K": 4096 if form == "wgmma" else 1024, "D": D,
                               "arch": "sm_90a"}, "sync" if form == "sync" else "", sorted_sums=False)
    p = {**base, "red": 4, "lv": True, **({"points": "streamed", "bm": 128, "bn": 256, "stages": 3, "sb": 1}
                                           if form == "streamed" else {})}
    assert kmeans_name(p).endswith("_lv" + (f"_sb{p['sb']}" if p.get("sb", 1) > 1 else "")) and kmeans_wide_supports(p, {"B": 1, "N": 10, "K": 8, "D": D, "arch": "sm_90a"})
    k = kmeans_wide_kernels(p, D, "sm_90a")["assign"]()
    assert not _errors(k), _errors(k)
    r = compile_ir(k, arch="sm_90a")
    assert r.ok and "cake::ld_u16x4(" in r.cuda_source
    r0 = compile_ir(kmeans_wide_kernels({**p, "lv": False}, D, "sm_90a")["assign"](), arch="sm_90a")
    assert "cake::ld_u16x4(" not in r0.cuda_source
    assert r.resources["spill_store_bytes"] <= r0.resources["spill_store_bytes"]
    assert not kmeans_wide_supports({**p, "red": 2}, {"B": 1, "N": 10, "K": 8, "D": D, "arch": "sm_90a"})
    with pytest.raises(ValueError, match="lv"):
        wide.kmeans_wide_assign_wgmma(128, red=2, lv=True)


@pytest.mark.parametrize("bm,bn,minb", [(128, 128, 1), (256, 64, 1), (128, 64, 2)])
def test_two_accumulator_form_verifies_and_compiles(bm, bn, minb):
    """acc2: tiles in pairs on two accumulators, a tile's argmin after the next tile's first chain is issued; ptxas
    keeps the wgmma asynchronous (no chain across the loop's back edge, none conditional), no spill; the pair's
    second tile past K is masked by topk's limit. Two [64, bn] accumulators must fit the thread's registers."""
    p = {"kind": "wide", "mma": "wgmma", "bm": bm, "bn": bn, "dc": 64, "stages": 4, "minb": minb, "red": 4,
         "acc2": True}
    shape = {"B": 1, "N": 1 << 20, "K": 300, "D": 128, "arch": "sm_90a"}
    assert kmeans_wide_supports(p, shape) and kmeans_name(p).endswith("_a2_r4")
    k = kmeans_wide_kernels(p, 128, "sm_90a")["assign"]()
    assert not _errors(k), _errors(k)
    r = compile_ir(k, arch="sm_90a")
    assert r.ok and r.resources["spill_store_bytes"] == 0, r.resources
    assert not [d for d in r.diagnostics if d.code == "W-BACKEND-WGMMA-SERIAL"]
    assert not kmeans_wide_supports({**p, "bm": 256, "bn": 128, "minb": 1}, shape)    # 128 accumulator registers
    assert not kmeans_wide_supports({**p, "stages": 2}, shape)
    with pytest.raises(ValueError, match="acc2"):
        wide.kmeans_wide_assign_wgmma(128, stages=2, acc2=True)


def test_rule_fits_shared_memory_per_arch():
    def rule(D, arch, mma=""):
        return kmeans_wide_params({"B": 1, "N": 10, "K": 8, "D": D, "arch": arch}, mma)
    assert rule(128, "sm_90a")["mma"] == "wgmma" and rule(128, "sm_80")["mma"] == "sync"
    assert rule(512, "sm_90a").get("points") is None and rule(512, "sm_90a")["red"] == 4
    for D in (768, 1024):       # a resident tile of all of D would leave 64 rows: the points stream too, by TMA
        p = rule(D, "sm_90a")
        assert p["points"] == "tma" and (p["bm"], p["bn"], p["stages"]) == (128, 256, 4)
        assert kmeans_wide_supports(p, {"B": 1, "N": 10, "K": 8, "D": D, "arch": "sm_90a"})
    assert rule(1024, "sm_90a", "sync").get("red", 1) == 1 and rule(128, "sm_80").get("red", 1) == 1
    assert rule(1024, "sm_90a", "sync")["bm"] == 64
    assert rule(1024, "sm_80")["bm"] == 32
    assert rule(128, "sm_80")["bm"] == 128
    assert rule(96, "sm_80")["dc"] == 32
    with pytest.raises(ValueError, match="shared memory"):
        wide.kmeans_wide_assign(1024, bm=128, arch="sm_90a")
    with pytest.raises(ValueError, match="shared memory"):
        wide.kmeans_wide_assign_wgmma(768, bm=128)
    assert not kmeans_wide_supports({"kind": "wide", "bm": 128, "bn": 64, "dc": 128, "stages": 3},
                                    {"B": 1, "N": 1 << 20, "K": 4096, "D": 1024, "arch": "sm_90a"})


def test_rule_pairs_ctas_at_small_d_and_k():
    """Up to D = 128 and K = 2048 two CTAs of 128 points per SM (one's scatter under the other's wgmma), except
    where the ping-pong form takes over (from K = 1024 at D 64 .. 128); from K = 4096, or past D = 128, one CTA
    of the largest tile; never on sm_80's mma.sync form."""
    def rule(D, K, arch="sm_90a", **kw):
        return kmeans_wide_params({"B": 1, "N": 1 << 20, "K": K, "D": D, "arch": arch}, **kw)
    for D, K, kw in ((32, 1024, {}), (64, 256, {}), (64, 512, {}), (128, 1024, {"pingpong": False}),
                     (128, 2048, {"pingpong": False})):
        p = rule(D, K, **kw)
        assert (p["bm"], p["bn"], p["stages"], p.get("minb"), p["red"]) == (128, 128, 4, 2, 4), (D, K, p)
        assert kmeans_wide_supports(p, {"B": 1, "N": 1 << 20, "K": K, "D": D, "arch": "sm_90a"})
    assert rule(64, 256)["copies"] == 8          # the copies of the sums ride along
    for D, K in ((128, 4096), (256, 1024), (64, 8192)):
        p = rule(D, K, pingpong=False)
        assert p.get("minb", 1) == 1 and p["bm"] == 256 and not p.get("points"), (D, K)
    assert rule(64, 256, "sm_80").get("minb", 1) == 1


def test_rule_takes_the_pingpong_form_at_mid_d_and_large_k():
    """Four warpgroups of 64 points from K = 1024 at D 64 .. 128; two from K = 2048 at D 160 .. 256, of 128 points
    while the 8-stage ring holds two tiles beside the resident points (D <= 192 here), else of 64; not at D = 32
    or 384, nor below those K, nor on sm_80."""
    def rule(D, K, arch="sm_90a"):
        return kmeans_wide_params({"B": 1, "N": 1 << 20, "K": K, "D": D, "arch": arch})
    for (D, K), bm, wgs in (((64, 1024), 256, 4), ((96, 2048), 256, 4), ((128, 65536), 256, 4),
                            ((160, 4096), 256, 2), ((192, 65536), 256, 2), ((256, 4096), 128, 2)):
        p = rule(D, K)
        assert (p.get("points"), p["bm"], p["bn"], p["stages"], p.get("wgs")) == ("pingpong", bm, 128, 8, wgs), \
            (D, K, p)
        assert kmeans_wide_supports(p, {"B": 1, "N": 1 << 20, "K": K, "D": D, "arch": "sm_90a"})
    for D, K in ((32, 8192), (64, 512), (160, 1024), (384, 8192), (1024, 4096)):
        assert rule(D, K).get("points") != "pingpong", (D, K)
    assert rule(128, 4096, "sm_80").get("points") is None


def test_family_rule_and_domain_errors():
    from cakelib.kmeans_lloyd import _is_wide
    base = {"B": 1, "N": 1 << 20, "arch": "sm_90a"}
    assert kmeans_family({**base, "K": 256, "D": 128}) == "table"
    assert kmeans_family({**base, "K": 257, "D": 128}) == "wide"
    assert kmeans_family({**base, "K": 16, "D": 64}) == "wide"
    assert not _is_wide({**base, "K": 256, "D": 128}, None)
    assert _is_wide({**base, "K": 65536, "D": 1024}, None)
    assert _is_wide({**base, "K": 100, "D": 128}, {"kind": "wide", "bm": 128, "bn": 64, "dc": 128, "stages": 3})
    with pytest.raises(ValueError, match="D = 16"):   # a caller's wide variant is held to the same domain
        kmeans_wide_supports(kmeans_wide_params({**base, "K": 100, "D": 128}), {**base, "K": 100, "D": 16}) or \
            _is_wide({**base, "K": 100, "D": 16}, None)
    assert kmeans_wide_domain_error({**base, "K": 65536, "D": 32}) == ""
    for shape, msg in [({**base, "K": 1024, "D": 16}, "D = 16"), ({**base, "K": 1024, "D": 2048}, "D = 2048"),
                       ({**base, "K": 1024, "D": 100}, "multiple of 32"), ({**base, "K": 65537, "D": 64}, "65536"),
                       ({"B": 1, "N": 1000, "K": 1024, "D": 64}, "exceeds the number of points")]:
        assert msg in kmeans_wide_domain_error(shape)
        with pytest.raises(ValueError, match="kmeans: "):
            _is_wide(shape, None)
    with pytest.raises(ValueError, match="multiple of 32"):
        wide.kmeans_wide_norms(40)


@pytest.mark.parametrize("form", ["sync", "wgmma", "streamed"])
def test_copies_of_the_sums(form):
    """With copies, each CTA adds into copy bid.x % P of the sums and the finalize sums every copy before the
    mean, then zeroes them all; the rule takes copies from 4096 points per cluster on."""
    p = {"sync": {"kind": "wide", "mma": "sync", "bm": 64, "bn": 64, "dc": 64, "stages": 3},
         "wgmma": {"kind": "wide", "mma": "wgmma", "bm": 128, "bn": 128, "dc": 64, "stages": 4, "red": 4},
         "streamed": {**STREAMED, "bn": 256, "stages": 3}}[form]
    kern = kmeans_wide_kernels({**p, "copies": 4}, 128, "sm_90a")
    assert kmeans_name({**p, "copies": 4}).endswith("_p4")
    assign, fin = kern["assign"](), kern["finalize"]()
    for k in (assign, fin):
        assert not _errors(k), _errors(k)
    src = compile_ir(assign, arch="sm_90a", emit="cuda").cuda_source.split("__global__")[-1]
    assert "% P" in src or "%P" in src.replace(" ", "")
    r = compile_ir(fin, arch="sm_90a")
    assert r.ok and r.cuda_source.count("fs[") > 0
    body = r.cuda_source.split("__global__")[-1]
    assert body.count("+ k0") >= 3 * 2      # copies 1..3 read, copies 1..3 zeroed (sums and counts each)
    rule = [(K, kmeans_wide_params({"B": 1, "N": 1 << 20, "K": K, "D": 64, "arch": "sm_90a"})["copies"])
            for K in (128, 256, 512, 1024, 2048, 65536)]
    assert rule == [(128, 8), (256, 8), (512, 1), (1024, 1), (2048, 1), (65536, 1)], rule
    with pytest.raises(ValueError, match="copies"):
        wide.kmeans_wide_finalize(128, copies=3)
    # a copy every cdiv(R, RB) RB rows: the last finalize CTA's rows past R stay inside its own copy
    fr = wide.finalize_rows(64)
    assert R_NOT_MULTIPLE % fr and wide.copy_rows(R_NOT_MULTIPLE, 64, 8) == 8 * (-(-R_NOT_MULTIPLE // fr) * fr)
    assert wide.copy_rows(R_NOT_MULTIPLE, 64, 1) == R_NOT_MULTIPLE


R_NOT_MULTIPLE = 231      # B K = 3 x 77: not a multiple of the finalize's rows per CTA at D = 64


def test_assignment_streams_chunks_and_scatters_globally():
    """The assignment reads C in [bn, dc] chunks through the ring (never a whole [bn, D] row block), stores the
    argmin and adds points straight into the global sums (red.global, no shared-memory sums)."""
    r = compile_ir(wide.kmeans_wide_assign(768, bm=64, arch="sm_90a"), arch="sm_90a", emit="cuda")
    src = r.cuda_source.split("__global__")[-1]
    assert "constexpr int NCH = 6;" in src and "red_add_shared" not in src
    assert src.count("red_add_global((WS") == 2 and "red_add_global((WC" in src    # a rolled loop over the slices
    r = compile_ir(wide.kmeans_wide_assign_wgmma(768, bm=64), arch="sm_90a", emit="cuda")
    src = r.cuda_source.split("__global__")[-1]
    assert "constexpr int NCH = 12;" in src and "wgmma.mma_async" in r.cuda_source and "red_add_shared" not in src


def distances_f64(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Squared distances [N, K] in float64."""
    x, c = x.astype(np.float64), c.astype(np.float64)
    return (x * x).sum(1)[:, None] + (c * c).sum(1)[None, :] - 2.0 * x @ c.T


def check_one_step(x, c, A, Cn) -> str:
    """"" where A is a nearest-centroid assignment (inertia within 1e-3 of float64's from the same centroids)
    and Cn the float64 means of A's clusters (empty: the centroid kept); else what fails."""
    x, c = x.astype(np.float64), c.astype(np.float64)
    d = distances_f64(x, c)
    K = c.shape[0]
    if (A < 0).any() or (A >= K).any():
        return "assignment out of range"
    best, got = d.min(1), d[np.arange(len(A)), A]
    rel = (got.sum() - best.sum()) / max(best.sum(), 1e-300)
    if rel > 1e-3:
        return f"inertia {rel:.3g} over float64's"
    cnt = np.bincount(A, minlength=K).astype(np.float64)
    sums = np.zeros_like(c)
    np.add.at(sums, A, x)
    own = np.where(cnt[:, None] > 0, sums / np.maximum(cnt, 1)[:, None], c)
    r = np.linalg.norm(Cn.astype(np.float64) - own) / max(np.linalg.norm(own), 1e-300)
    return "" if r <= 1e-4 else f"centroids rel error {r:.3g} vs the means of the own assignment"


def test_reference_check_passes_a_float64_step_and_fails_wrong_ones():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 64)).astype(np.float16).astype(np.float32)
    c = x[rng.choice(3000, 300, replace=False)]
    a = distances_f64(x, c).argmin(1)
    cnt = np.bincount(a, minlength=300)[:, None]
    sums = np.zeros((300, 64))
    np.add.at(sums, a, x.astype(np.float64))
    means = np.where(cnt > 0, sums / np.maximum(cnt, 1), c)
    assert check_one_step(x, c, a, means) == ""
    wrong = a.copy()
    wrong[: len(a) // 2] = (wrong[: len(a) // 2] + 1) % 300
    assert "inertia" in check_one_step(x, c, wrong, means) or "nearest" in check_one_step(x, c, wrong, means)
    assert "centroids" in check_one_step(x, c, a, means * 1.01)


def _gpu():
    try:
        from gpu_backend.driver import gpu_available
        return gpu_available()
    except Exception:  # noqa: BLE001
        return False


PP = {"kind": "wide", "mma": "wgmma", "points": "pingpong", "dc": 64, "bm": 256, "bn": 128, "stages": 8, "red": 4}


@pytest.mark.parametrize("D", [32, 96, 128, 256, 512])
@pytest.mark.parametrize("form", [PP, {**PP, "bm": 128, "bn": 256, "stages": 4, "copies": 4},
                                  {**PP, "bm": 128, "bn": 128, "stages": 6, "red": 1},
                                  {**PP, "wgs": 3, "bm": 192}, {**PP, "wgs": 4}, {**PP, "wgs": 4, "pt": 4},
                                  {**PP, "wgs": 4, "handoff": "first"}, {**PP, "handoff": "before"},
                                  {**PP, "wgs": 3, "bm": 192, "a_regs": True}, {**PP, "bm": 128, "a_regs": True},
                                  {**PP, "wgs": 4, "bn": 64, "a_regs": True}])
def test_pingpong_form_verifies_and_compiles(D, form):
    """The ping-pong form (tasks/kmeans/wide_pingpong.py): resident points by TMA, a TMA centroid ring, two
    consumer warpgroups taking turns on named barriers; no spills, sm_90a only, a tile that does not fit is
    refused with the shared memory it needs."""
    shape = {"B": 1, "N": 1 << 20, "K": 65536, "D": D, "arch": "sm_90a"}
    fits = kmeans_wide_supports(form, shape)
    if not fits:
        with pytest.raises(ValueError, match="shared memory|stages >= D / 64|registers"):
            kmeans_wide_kernels(form, D, "sm_90a")["assign"]()
        assert D >= 256 or form.get("a_regs")
        return
    wgs = form.get("wgs", 2)
    head = f"kmeans_wide_bm{form['bm']}_bn{form['bn']}_c64_s{form['stages']}_wg_pp" + (str(wgs) if wgs != 2 else "") \
        + (f"_t{form['pt']}" if form.get("pt", 1) > 1 else "") \
        + (f"_h{form['handoff'][0]}" if form.get("handoff", "issued") != "issued" else "") \
        + ("_ra" if form.get("a_regs") else "")
    assert kmeans_name(form) == head or kmeans_name(form).startswith(head + "_")
    assert not kmeans_wide_supports(form, {**shape, "arch": "sm_80"})
    k = kmeans_wide_kernels(form, D, "sm_90a")["assign"]()
    assert not _errors(k), _errors(k)
    assert k.launch.threads == 128 + 128 * wgs
    r = compile_ir(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics if d.severity == "error"]
    assert "0 B spill stores" in next(d.message for d in r.diagnostics if d.code == "N-BACKEND-RESOURCES")
    src = r.cuda_source
    turns = [f"cake::bar_sync({1 + wgs + w}, 256)" for w in range(wgs)] + [f"cake::bar_arrive({1 + wgs}, 256)"]
    assert "cake::tma_load_2d(" in src and all(t in src for t in turns)
    assert not any(d.code == "W-BACKEND-WGMMA-SERIAL" for d in r.diagnostics)
    assert ("cake::ldmatrix_x4(" in src) == bool(form.get("a_regs"))   # A fragments: loaded once a point tile


def test_pingpong_form_refuses_d_beyond_its_tile():
    assert not kmeans_wide_supports(PP, {"B": 1, "N": 4096, "K": 512, "D": 768, "arch": "sm_90a"})
    with pytest.raises(ValueError, match="D <= 512"):
        kmeans_wide_kernels(PP, 768, "sm_90a")["assign"]()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mma", ["sync", "wgmma", "b2", "red1", "streamed", "copies", "tma", "tma_p4", "lv", "acc2",
                                 "pp", "pp_wr64", "pp3", "pp4", "pp4_t4", "pp_t2", "pp4_hf", "pp_hb", "pp3_ra", "pp_ra", "tma_cl2", "tma_cl2_bm64",
                                 "tma_t2", "tma_t4_p2", "tma_t8_lv", "tma_sb8", "tma_sb2_lv_p4", "tma_t4_sb4"])
@pytest.mark.parametrize("B,N,D,K", [(1, 5000, 32, 1024), (2, 3001, 96, 300), (1, 4099, 768, 1030),
                                     (1, 2000, 1024, 129), (3, 999, 64, 77), (1, 20011, 128, 2048),
                                     (1, 9001, 64, 2500)])
def test_wide_kmeans_matches_float64(B, N, D, K, mma):
    import torch
    from cakelib import kmeans
    from gpu_backend.driver import arch_of, properties
    arch = arch_of(properties(0))
    if mma != "sync" and arch != "sm_90a":
        pytest.skip("wgmma and vector reds need sm_90a")
    if mma == "b2" and D > 256:
        pytest.skip("two CTAs per SM fit up to D = 256")
    if mma == "acc2" and D >= 768:
        pytest.skip("two distance accumulators are a resident-form option (the TMA form from D = 768)")
    if mma.startswith("tma") and D < 64:
        pytest.skip("the TMA form runs from D = 64 (a 64-dim box)")
    if "_sb" in mma and D % (16 * int(mma.split("_sb")[1][0])):
        pytest.skip("a scatter slice of sb groups of 16 dims divides D")
    if mma.startswith("pp") and D > 512:
        pytest.skip("the ping-pong form holds the point tile: D <= 512")
    pick = kmeans_wide_params({"B": B, "N": N, "K": K, "D": D, "arch": arch}, "sync" if mma == "sync" else "")
    resident = kmeans_wide_params({"B": B, "N": N, "K": K, "D": D, "arch": arch}, pingpong=False)  # acc2's form
    variant = {"b2": B2, "red1": {**pick, "red": 1, "sb": 1}, "streamed": STREAMED,          # red1: scalar reds
               "copies": {**pick, "copies": 8 if D < 768 else 4, "sums": "reds"}, "tma": TMA,
               "tma_p4": {**TMA, "bn": 128, "stages": 6, "copies": 4}, "lv": {**pick, "lv": True},
               "pp": PP, "pp_wr64": {**PP, "bm": 128, "bn": 256, "stages": 4, "copies": 2},
               "pp3": {**PP, "wgs": 3, "bm": 192}, "pp4": {**PP, "wgs": 4, "copies": 2},
               "pp4_t4": {**PP, "wgs": 4, "pt": 4}, "pp_t2": {**PP, "bm": 128, "pt": 2},
               "pp4_hf": {**PP, "wgs": 4, "handoff": "first"}, "pp_hb": {**PP, "handoff": "before"},
               "pp3_ra": {**PP, "wgs": 3, "bm": 192, "a_regs": True}, "pp_ra": {**PP, "bm": 128, "a_regs": True},
               "tma_cl2": {**TMA, "cluster": 2}, "tma_cl2_bm64": {**TMA, "bm": 64, "cluster": 2, "copies": 2},
               "tma_t2": {**TMA, "pt": 2}, "tma_t4_p2": {**TMA, "pt": 4, "copies": 2},
               "tma_t8_lv": {**TMA, "pt": 8, "bm": 64, "lv": True}, "tma_sb8": {**TMA, "sb": 8},
               "tma_sb2_lv_p4": {**TMA, "sb": 2, "lv": True, "copies": 4}, "tma_t4_sb4": {**TMA, "pt": 4, "sb": 4},
               "acc2": {**resident, "acc2": True, "stages": 4,     # two [64, bn] accumulators fit at bn 64 there
                        "bn": 64 if resident.get("bm") == 256 or resident.get("minb", 1) > 1 else resident.get("bn")}
               }.get(mma, pick)
    g = torch.Generator().manual_seed(B * N + D + K)
    x = (torch.randn(B, N, D, generator=g) + 3 * torch.randn(B, 1, D, generator=g)).half().cuda()
    c0 = x[:, torch.randperm(N, generator=g)[:K].cuda()].clone()
    Cn, A = kmeans(x, K, 1, init=c0, variant=variant)
    xs, cs = x.float().cpu().numpy(), c0.float().cpu().numpy()
    for b in range(B):
        err = check_one_step(xs[b], cs[b], A[b].cpu().numpy(), Cn[b].cpu().numpy())
        assert not err, f"batch {b}: {err}"
    # several iterations: the last assignment is to the centroids the last iteration started from
    C3, A3 = kmeans(x, K, 3, init=c0, variant=variant)
    C2, _ = kmeans(x, K, 2, init=c0, variant=variant)
    c2 = C2.half().float().cpu().numpy()
    for b in range(B):
        err = check_one_step(xs[b], c2[b], A3[b].cpu().numpy(), C3[b].cpu().numpy())
        assert not err, f"3 iterations, batch {b}: {err}"


class _FakeBuf:
    """A device buffer stand-in: a pointer-like id and a shape (gpu_backend.runner._ptr_shape reads both)."""

    def __init__(self, shape):
        self.ptr, self.shape = id(self), tuple(shape)

    def reshaped(self, shape):
        return _FakeBuf(shape)

    @property
    def view(self):
        return self


class _FakeRuntime:
    """Builds each kernel's IR for sm_90a (no compile) and checks every launch against its declarations."""
    arch = "sm_90a"

    def __init__(self):
        self.launches = []

    def kernel(self, key, build):
        from cake_ir.nodes import TensorParam
        from gpu_backend.runner import scalar_decls
        k = build(self.arch)
        tensors = {p.name: p for p in k.params if isinstance(p, TensorParam)}
        return (k.name, tensors, scalar_decls(k), dict(k.consts))

    def workspace(self, name, shape, dtype, stream=0):
        return _FakeBuf(shape)

    def launch(self, kern, tensors, scalars, stream=0):
        from gpu_backend.runner import eval_index
        name, decls, sdecls, consts = kern
        assert set(tensors) == set(decls), (name, set(tensors) ^ set(decls))
        for t, buf in tensors.items():
            want = [eval_index(s, {**consts, **scalars}) for s in decls[t].shape]
            assert list(buf.shape) == want, (name, t, list(buf.shape), want)
        assert set(scalars) == set(sdecls), (name, set(scalars) ^ set(sdecls))
        self.launches.append((name, {t: b.ptr for t, b in tensors.items()}))


@pytest.mark.parametrize("B,N,D,K,iters,copies", [(1, 5000, 96, 1024, 3, 1), (3, 999, 1024, 77, 2, 1),
                                                   (3, 999, 64, 77, 2, 8), (1, 2000, 1024, 129, 2, 4)])
def test_wide_loop_launches_match_the_kernels_declarations(monkeypatch, B, N, D, K, iters, copies):
    """The library's wide loop (cakelib/kmeans_lloyd._wide_loop) with the sums by reds (the counting sort's loop:
    tests/test_kmeans_sorted_sums.py) on a fake runtime: 3 launches per iteration
    whose buffers have the shapes the kernels declare; each finalize writes an fp16 buffer that is not the one
    its iteration read, and the next iteration reads it."""
    from cakelib import arrays, kmeans_lloyd
    monkeypatch.setattr(arrays, "empty_like_kind", lambda like, shape, dtype, scratch=False: _FakeBuf(shape))
    monkeypatch.setattr(arrays, "stream_of", lambda arg: 0)
    rt = _FakeRuntime()
    p = {**kmeans_wide_params({"B": B, "N": N, "K": K, "D": D, "arch": "sm_90a"}, sorted_sums=False), "copies": copies}
    xa, ca = _FakeBuf((B, N, D)), _FakeBuf((B, K, D))
    kmeans_lloyd._wide_loop(rt, p, xa, ca, _FakeBuf((B, N)), _FakeBuf((B * K, D)), B, N, K, D, iters)
    names = [n for n, _ in rt.launches]
    assert len(names) == 3 * iters and names[:3] == [f"kmeans_wide_norms_d{D}", kmeans_wide_kernels(
        p, D, "sm_90a")["assign"]().name, kmeans_wide_kernels(p, D, "sm_90a")["finalize"]().name]
    fin = [ptrs for n, ptrs in rt.launches if n.startswith("kmeans_wide_finalize")]
    assign = [ptrs for n, ptrs in rt.launches if n.startswith("kmeans_wide_d")]
    for i, f in enumerate(fin):
        assert f["C16"] != f["C"]
        if i + 1 < iters:
            assert assign[i + 1]["C"] == f["C16"]
