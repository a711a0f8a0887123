"""Calibration (CPU): microbenchmark programs verify and compile for sm_90a, their declared work is
what the cost model counts, fitting recovers known constants from synthetic measurements and never
produces non-positive constants, Spearman with ties, the variant set, and calibration.run end to end
with the GPU calls replaced by synthetic measurements."""
import json
import math
from dataclasses import fields, replace

import numpy as np
import pytest

from cake_ir import arch as A
from cake_ir.arch import ArchSpec
from cake_ir.compiler import compile_kernel
from cake_ir.cost import estimate, load_constants
from cake_ir.verifier import verify
from calibration import fit as F
from calibration.micro import all_micros
from calibration.micro.base import convert, expected_seconds
from calibration.stats import log_errors, rankdata, spearman

SMS = 132
MICROS = all_micros(SMS, quick=False)
QUICK = all_micros(SMS, quick=True)
BASE = A.spec("sm_90a")


# ----------------------------------------------------------------------------- microbenchmarks
@pytest.mark.parametrize("m", MICROS, ids=lambda m: m.name)
def test_micro_verifies_clean_and_compiles(m):
    v = verify(m.kernel)
    errors = [d.short() for d in v.diagnostics if d.severity == "error"]
    assert not errors, errors
    unexpected = [d.short() for d in v.diagnostics if d.code not in m.allowed_warnings]
    assert not unexpected, unexpected
    r = compile_kernel(m.kernel, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics]
    backend = [d.short() for d in r.diagnostics if d.code.startswith("W-BACKEND")]
    assert not backend, backend
    assert r.resources.get("spill_store_bytes", 0) == 0


def test_micro_registry_is_consistent():
    names = [m.name for m in MICROS]
    assert len(names) == len(set(names))
    assert [m.name for m in QUICK] == names
    known = {f.name for f in fields(ArchSpec)}
    for m in MICROS:
        assert set(m.informs) <= known, m.name
        assert set(m.subtract) <= known, m.name
        assert m.kind in ("launch", "rate", "rate_per_sm", "latency", "info")
        assert m.description
        params = {p.name for p in m.kernel.params}
        assert set(m.shapes) | set(m.tensors) <= params, m.name
    primaries = {f for m in MICROS if m.primary for f in m.informs}
    for f in F.FITTED_FIELDS:
        if f != "clock_hz":
            assert f in primaries, f"no primary microbenchmark informs {f}"


def _model_work(m, rep):
    t = rep.totals
    if m.family in ("hbm", "l2"):
        return t["bytes"]
    if m.family == "tensor":
        return t["tensor_flops"]
    if m.family == "smem":
        return t["smem_bytes"]
    if m.name == "simt_fmul":
        return 2 * t["simt_ops"]
    if m.name.startswith("sfu_"):
        return t["sfu_ops"]
    raise AssertionError(m.name)


@pytest.mark.parametrize("m", [m for m in MICROS if m.kind in ("rate", "rate_per_sm", "info")], ids=lambda m: m.name)
def test_micro_work_is_what_the_cost_model_counts(m):
    """A rate converts work / time; work must be counted as cake_ir.cost counts it, and the launch must
    be a single wave so per-SM conversions hold."""
    rep = estimate(m.kernel, m.shapes)
    assert rep.waves == 1 and rep.blocks <= rep.resident_ctas, (rep.waves, rep.blocks, rep.blocks_per_sm)
    got = _model_work(m, rep)
    # Accumulator stores / initial fills add a little (< 1%) traffic the conversion leaves out.
    assert got == pytest.approx(m.work, rel=0.01), (got, m.work)


def test_latency_micros_are_single_cta_loops():
    for m in MICROS:
        if m.kind == "latency":
            assert m.kernel.launch.grid == [1], m.name
            assert m.work == m.shapes["J"], m.name


# ----------------------------------------------------------------------------- synthetic data
def _truth() -> ArchSpec:
    return replace(BASE, hbm_bw=3.9e12, l2_bw=11.5e12, smem_bw_per_sm=2.3e11, mma_sync_flops=410e12,
                   wgmma_flops=690e12, fp32_flops=60e12, sfu_ops=3.9e12, launch_overhead_s=4.5e-6,
                   tma_latency_s=1.3e-6, cp_async_latency_s=0.95e-6, mbarrier_roundtrip_s=0.15e-6)


def _synth(micros, truth, sms=SMS, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    recs = []
    for m in micros:
        r = m.describe()
        if m.kind == "info":
            t = 1e-3 * (1 + m.extra.get("expected_conflict_ways", 1) / 10)
        else:
            f = m.informs[0]
            sub = sum(getattr(truth, s) for s in m.subtract)
            t = expected_seconds(m.kind, getattr(truth, f), m.work, t_launch=truth.launch_overhead_s, sms=sms,
                                 subtract=sub)
        r["seconds"] = t * (1 + noise * rng.standard_normal())
        r["correct"] = True
        recs.append(r)
    return recs


def test_convert_and_expected_seconds_are_inverse():
    for kind, value, work in (("rate", 4e12, 2e9), ("rate_per_sm", 2e11, 1e10), ("latency", 1e-6, 2000.0)):
        t = expected_seconds(kind, value, work, t_launch=3e-6, sms=132, subtract=0.2e-6)
        assert convert(kind, t, work, t_launch=3e-6, sms=132, subtract=0.2e-6) == pytest.approx(value, rel=1e-12)
    assert convert("launch", 4e-6, 1.0) == 4e-6
    assert convert("info", 1e-3, 1.0) is None


def test_direct_recovers_known_constants():
    truth = _truth()
    d = F.direct(_synth(MICROS, truth), BASE, sms=SMS)
    for f in F.FITTED_FIELDS:
        if f == "clock_hz":
            continue
        assert d.values[f] == pytest.approx(getattr(truth, f), rel=1e-9), f
        assert d.derivations[f]["source"] == "measured"
    assert d.derivations["tma_latency_s"]["from"] == "lat_tma_cold"
    assert d.derivations["hbm_bw"]["rule"] == "max"
    # Bank-conflict slowdowns are reported, relative to the conflict-free column read.
    assert set(d.info) == {"smem_lds_col_swz128_slowdown_vs_smem_lds_col_pad1",
                           "smem_lds_col_pad0_slowdown_vs_smem_lds_col_pad1"}
    assert all(v > 0 for v in d.info.values())


def test_direct_uses_device_facts_and_ignores_failed_checks():
    truth = _truth()
    recs = _synth(MICROS, truth)
    for r in recs:
        if r["name"] == "hbm_tma_copy":
            r["seconds"] *= 0.5          # would be the max ...
            r["correct"] = False         # ... but its copy check failed
    d = F.direct(recs, BASE, device={"sms": 132, "l2_bytes": 62914560, "clock_khz": 1980000})
    assert d.values["hbm_bw"] == pytest.approx(truth.hbm_bw, rel=1e-9)
    assert d.values["l2_bytes"] == 62914560 and d.values["sms"] == 132
    assert d.values["clock_hz"] == pytest.approx(1.98e9)


def test_direct_secondary_measurements_do_not_set_constants():
    truth = _truth()
    recs = _synth(MICROS, truth)
    for r in recs:
        if r["name"] == "hbm_tma_read":      # non-primary, twice as fast: reported, not used
            r["seconds"] = r["seconds"] / 2
    d = F.direct(recs, BASE, sms=SMS)
    assert d.values["hbm_bw"] == pytest.approx(truth.hbm_bw, rel=1e-9)
    assert "hbm_tma_read" in d.derivations["hbm_bw"]["secondary"]


@pytest.mark.parametrize("bad", [None, 0.0, -1e-3, float("nan"), float("inf")])
def test_direct_never_produces_nonpositive_constants(bad):
    recs = _synth(MICROS, _truth())
    for r in recs:
        r["seconds"] = bad
    d = F.direct(recs, BASE, sms=SMS)
    spec = d.spec(BASE)
    for f in F.FITTED_FIELDS:
        v = getattr(spec, f)
        assert math.isfinite(v) and v > 0, f
    assert not d.values            # nothing measured: the table stays
    assert any("no usable measurement" in n for n in d.notes)


def test_direct_latency_is_positive_even_below_the_subtracted_roundtrip():
    truth = _truth()
    recs = _synth(MICROS, truth)
    for r in recs:
        if r["name"] == "lat_tma_cold":   # faster than an mbarrier round trip per iteration
            r["seconds"] = truth.launch_overhead_s + 0.5 * truth.mbarrier_roundtrip_s * r["work"]
    d = F.direct(recs, BASE, sms=SMS)
    assert d.values["tma_latency_s"] > 0


def test_direct_is_robust_to_noise():
    truth = _truth()
    d = F.direct(_synth(MICROS, truth, noise=0.02, seed=3), BASE, sms=SMS)
    for f in ("hbm_bw", "wgmma_flops", "tma_latency_s", "launch_overhead_s"):
        assert d.values[f] == pytest.approx(getattr(truth, f), rel=0.15), f


# ------------------------------------------------------------------------------------ refine
def _analytic_predict(spec, s):
    """A smooth stand-in for the cost model: each sample has its own mix of terms."""
    a, b, c, d = s.shapes["a"], s.shapes["b"], s.shapes["c"], s.shapes["d"]
    return a / spec.hbm_bw + b / spec.wgmma_flops + c * spec.tma_latency_s + d * spec.launch_overhead_s


def _analytic_samples(truth, n=24, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        sh = {"a": float(rng.uniform(0, 2e9)), "b": float(rng.uniform(0, 1e12)),
              "c": float(rng.integers(0, 300)), "d": 1.0}
        s = F.Sample(f"s{i}", None, sh, 0.0)
        s.seconds = _analytic_predict(truth, s)
        out.append(s)
    return out


def test_refine_recovers_group_factors_on_synthetic_data():
    truth = replace(BASE, hbm_bw=BASE.hbm_bw * 0.8, wgmma_flops=BASE.wgmma_flops * 1.25,
                    tma_latency_s=BASE.tma_latency_s * 1.5)
    samples = _analytic_samples(truth)
    rr = F.refine(BASE, samples, ridge=0.0, predict=_analytic_predict, sweeps=6)
    assert rr.scales["memory"] == pytest.approx(0.8, rel=0.02)
    assert rr.scales["wgmma"] == pytest.approx(1.25, rel=0.02)
    assert rr.scales["latency"] == pytest.approx(1.5, rel=0.03)
    # Groups the predictions do not depend on stay exactly at 1.
    for g in ("mma_sync", "simt", "issue"):
        assert rr.scales[g] == 1.0 and g not in rr.active
    assert rr.objective_after < 1e-3 < rr.objective_before
    assert rr.after["rms_log"] < rr.before["rms_log"]


def test_refine_with_the_cost_model_recovers_factors():
    from tasks.gemm.programs import gemm_wgmma_sm90a
    from calibration.variants import softmax_kernel

    truth = replace(BASE, hbm_bw=BASE.hbm_bw * 0.85, wgmma_flops=BASE.wgmma_flops * 0.8)
    ks = [("sm4096", softmax_kernel(4096, 8, 8), {"M": 16384}),
          ("sm2048", softmax_kernel(2048, 4, 8), {"M": 65536}),
          ("g1", gemm_wgmma_sm90a(128, 256, 64, 4, 2), {"M": 4096, "N": 4096, "K": 8192}),
          ("g2", gemm_wgmma_sm90a(128, 256, 64, 3, 2), {"M": 2048, "N": 4096, "K": 16384})]
    samples = [F.Sample(n, k, sh, estimate(k, sh, truth).seconds) for n, k, sh in ks]
    groups = {g: F.GROUPS[g] for g in ("memory", "wgmma")}
    rr = F.refine(BASE, samples, groups, ridge=0.0, sweeps=5)
    assert rr.scales["memory"] == pytest.approx(0.85, rel=0.03)
    assert rr.scales["wgmma"] == pytest.approx(0.8, rel=0.03)
    assert rr.after["rms_log"] < 0.02


@pytest.mark.parametrize("factor", [1e-4, 1e4])
def test_refine_never_produces_nonpositive_constants(factor):
    truth = _truth()
    samples = _analytic_samples(truth, n=8)
    for s in samples:
        s.seconds *= factor
    rr = F.refine(BASE, samples, predict=_analytic_predict, max_factor=4.0)
    for g, s in rr.scales.items():
        assert 0.25 - 1e-9 <= s <= 4.0 + 1e-9, (g, s)
    for f in F.FITTED_FIELDS:
        v = getattr(rr.spec, f)
        assert math.isfinite(v) and v > 0, f


def test_refine_ignores_unusable_samples_and_handles_none():
    samples = _analytic_samples(_truth(), n=6)
    samples[0].seconds = float("nan")
    samples[1].seconds = 0.0
    rr = F.refine(BASE, samples, predict=_analytic_predict)
    assert len(rr.predictions) == 4
    rr0 = F.refine(BASE, [], predict=_analytic_predict)
    assert all(s == 1.0 for s in rr0.scales.values())


# --------------------------------------------------------------------------- calibration file
def test_calibration_document_round_trips_through_load_constants(tmp_path):
    truth = _truth()
    d = F.direct(_synth(MICROS, truth), BASE, sms=SMS, device={"sms": 132, "l2_bytes": 62914560})
    spec = d.spec(BASE)
    fitted = sorted(d.values)
    path = tmp_path / "h200.json"
    assert F.next_version(path) == 1
    doc = F.calibration_document(spec, fitted, "sm_90a", "h200", F.next_version(path), {"micro": []}, ["n"])
    F.write_json(path, doc)
    got = load_constants(str(path))
    for f in fitted:
        assert getattr(got, f) == pytest.approx(getattr(spec, f)), f
    assert got.name == "sm_90a"
    assert F.next_version(path) == 2
    with pytest.raises(ValueError):
        F.overrides(replace(spec, hbm_bw=-1.0), ["hbm_bw"])
    with pytest.raises(ValueError):
        F.overrides(spec, ["features"])


# ------------------------------------------------------------------------------------- stats
def test_rankdata_averages_ties():
    assert rankdata([10, 20, 20, 30]).tolist() == [1, 2.5, 2.5, 4]
    assert rankdata([3, 1, 2]).tolist() == [3, 1, 2]
    assert rankdata([5, 5, 5]).tolist() == [2, 2, 2]
    assert rankdata([]).tolist() == []


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 8, 27, 64.5]) == pytest.approx(1.0)   # rank-based: monotone = 1
    # with ties: ranks x = [1, 2.5, 2.5, 4], y = [1, 3, 2, 4]; Pearson of the ranks
    rx, ry = np.array([1, 2.5, 2.5, 4]), np.array([1, 3, 2, 4.0])
    want = np.corrcoef(rx, ry)[0, 1]
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(want)
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert spearman([1], [1]) is None
    assert spearman([1, float("nan")], [1, 2]) is None
    with pytest.raises(ValueError):
        spearman([1, 2], [1, 2, 3])


def test_spearman_matches_a_brute_force_definition_without_ties():
    rng = np.random.default_rng(0)
    x, y = rng.random(30), rng.random(30)
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    n = 30
    want = 1 - 6 * np.sum((rx - ry) ** 2) / (n * (n * n - 1))
    assert spearman(x, y) == pytest.approx(want)


def test_log_errors():
    e = log_errors([2.0, 1.0], [1.0, 1.0])
    assert e["n"] == 2 and e["max_abs_log"] == pytest.approx(math.log(2))
    assert log_errors([0.0], [1.0])["n"] == 0


# ----------------------------------------------------------------------------------- variants
def test_variant_builder_yields_at_least_36_compiling_variants():
    from calibration.variants import all_variants

    vs = all_variants()
    families = {}
    compiled = 0
    for v in vs:
        if v.skip_reason:
            continue
        assert v.shapes, v.name
        r = compile_kernel(v.kernel(), arch="sm_90a")
        assert r.ok, (v.name, [d.short() for d in r.diagnostics if d.severity == "error"][:3])
        compiled += 1
        families[v.family] = families.get(v.family, 0) + 1
    assert compiled >= 36
    assert families["gemm"] >= 20 and families["softmax"] >= 12
    names = [v.name for v in vs]
    assert len(names) == len(set(names))
    wg = [v.params for v in vs if v.params.get("impl") == "wgmma" and not v.skip_reason]
    assert {p["bn"] for p in wg} == {128, 256} and {p["stages"] for p in wg} == {3, 4, 5}
    assert {p["consumers"] for p in wg} == {1, 2}
    sm = [v.params for v in vs if v.family == "softmax" and not v.skip_reason]
    assert {p["n"] for p in sm} == {2048, 4096, 8192} and {p["warps"] for p in sm} == {4, 8, 16}
    assert {p["vec"] for p in sm} == {4, 8}


def test_refine_set_compiles_and_is_disjoint_in_shape_from_the_ranking():
    from calibration.variants import GEMM_SHAPES, SOFTMAX_M, refine_set

    for v in refine_set():
        assert compile_kernel(v.kernel(), arch="sm_90a").ok, v.name
        for s in v.shapes:
            if v.family == "gemm":
                assert s not in GEMM_SHAPES, v.name
            else:
                assert s["M"] != SOFTMAX_M, v.name


# ------------------------------------------------------------------------------ host-side checks
def test_host_bits_and_copy_check():
    from calibration.measure import HOST_BLOCK, copy_matches, fully_written, host_bits

    a = host_bits((2 * HOST_BLOCK + 5,), "bf16", "randn", seed=1)
    assert a.dtype == np.uint16 and a.shape == (2 * HOST_BLOCK + 5,)
    assert np.array_equal(a[:HOST_BLOCK], a[HOST_BLOCK:2 * HOST_BLOCK])
    assert np.array_equal(a, host_bits(a.shape, "bf16", "randn", seed=1))
    ok, _ = copy_matches(a, a.copy())
    assert ok
    b = a.copy()
    b[12345] ^= 1
    ok, msg = copy_matches(a, b)
    assert not ok and "12345" in msg
    from gpu_backend.memory import POISON_BITS
    y = np.zeros((4, 4), np.uint32)
    assert fully_written(y, "f32")[0]
    y[1, 2] = POISON_BITS["f32"]
    assert not fully_written(y, "f32")[0]


def test_softmax_check_catches_wrong_and_unwritten_rows():
    from calibration.measure import softmax_base, softmax_check
    from gpu_backend.memory import POISON_BITS, f32_to_bf16_bits

    x, ref = softmax_base(2048, rows=64, seed=0)
    assert x.shape == (64, 2048) and np.allclose(ref.sum(axis=1), 1.0)
    y = np.tile(f32_to_bf16_bits(ref.astype(np.float32)), (4, 1))      # M = 256 rows, base 64
    good = softmax_check(y, ref)
    assert good["ok"], good
    bad = y.copy()
    bad[255] = f32_to_bf16_bits(np.full(2048, 1.0 / 2048, np.float32))  # last row wrong
    assert not softmax_check(bad, ref)["ok"]
    unw = y.copy()
    unw[100, 7] = POISON_BITS["bf16"]                                      # a middle row unwritten
    assert not softmax_check(unw, ref)["ok"]


# ---------------------------------------------------------------------- calibration.run, no GPU
def test_calibration_run_end_to_end_with_synthetic_measurements(tmp_path, monkeypatch):
    import calibration.measure as M
    import gpu_backend.timing as T
    from calibration import run as R

    truth = _truth()
    dev = {"name": "NVIDIA H200", "cc": [9, 0], "sms": 132, "l2_bytes": 62914560, "clock_khz": 1980000,
           "smem_per_block_optin": 232448, "driver": 13000}
    by_name = {m.name: m for m in all_micros(132, quick=True)}

    def fake_micro(m, timer, on_timeout=None):
        return _synth([by_name[m.name]], truth)[0]

    def fake_variant(name, family, kernel, compiled, shape, inputs, timer, tol=1e-2, on_timeout=None):
        return {"name": name, "family": family, "shapes": dict(shape), "correct": True,
                "seconds": estimate(kernel, shape, truth).seconds}

    class FakeInputs:
        def free(self):
            pass

    monkeypatch.setattr(M, "device_info", lambda ordinal=0: dict(dev))
    monkeypatch.setattr(M, "run_micro", fake_micro)
    monkeypatch.setattr(M, "run_variant", fake_variant)
    monkeypatch.setattr(M, "InputCache", FakeInputs)
    monkeypatch.setattr(M, "warm_compile_cache", lambda kernels, jobs=None: None)
    monkeypatch.setattr(T.L2Flusher, "for_device", classmethod(lambda cls, device=0: None))
    monkeypatch.setattr(T, "copy_ceiling_tbps", lambda nbytes=0, device=0, reps=20: 4.2, raising=False)
    monkeypatch.delenv("OUT", raising=False)
    out = tmp_path / "h200.json"
    assert R.main(["--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["version"] == 1 and doc["gpu"] == "h200" and doc["arch"] == "sm_90a"
    m = doc["measured"]
    assert m["device"]["name"] == "NVIDIA H200" and m["command"].startswith("python -m calibration.run")
    assert m["date"] and m["versions"]["numpy"]
    assert m["reference"]["cuMemcpyDtoD_TBps"] == 4.2
    assert len(m["micro"]) == len(by_name) and len(m["refine_samples"]) >= 5
    spec = load_constants(str(out))
    for f in ("hbm_bw", "wgmma_flops", "mma_sync_flops", "launch_overhead_s", "tma_latency_s"):
        assert getattr(spec, f) == pytest.approx(getattr(truth, f), rel=0.1), f
        assert getattr(spec, f) > 0
    assert spec.l2_bytes == 62914560
    assert R.main(["--quick", "--out", str(out), "--no-refine"]) == 0
    assert json.loads(out.read_text())["version"] == 2
    # Refit from the stored raw measurements, no GPU.
    refit = tmp_path / "refit.json"
    assert F.main(["--from", str(out), "--out", str(refit), "--no-refine"]) == 0
    again = load_constants(str(refit))
    assert again.hbm_bw == pytest.approx(spec.hbm_bw) and json.loads(refit.read_text())["version"] == 1


def test_gpu_slug():
    from calibration.run import gpu_slug

    assert gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert gpu_slug("NVIDIA GeForce RTX 4090") == "rtx4090"


def test_rank_spearman_report():
    import importlib.util
    import pathlib

    p = pathlib.Path(__file__).resolve().parent.parent / "bench" / "rank_variants.py"
    spec = importlib.util.spec_from_file_location("rank_variants", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = []
    for i in range(5):
        rows.append({"family": "gemm", "impl": "wgmma", "shapes": {"M": 4096, "N": 4096, "K": 4096},
                     "seconds": 1.0 + i, "correct": True, "pred_table_s": 1.0 + i, "pred_calibrated_s": 5.0 - i})
        rows.append({"family": "softmax", "shapes": {"M": 65536}, "seconds": 1.0 + i, "correct": i != 2,
                     "pred_table_s": 2.0, "pred_calibrated_s": 1.0 + i})
    sp = mod.spearman_report(rows)
    assert sp["gemm"]["table"] == pytest.approx(1.0) and sp["gemm"]["calibrated"] == pytest.approx(-1.0)
    assert sp["softmax"]["table"] is None and sp["softmax"]["calibrated"] == pytest.approx(1.0)
    assert sp["softmax"]["n"] == 4
    assert sp["gemm@4096x4096x4096"]["n"] == 5 and sp["overall"]["n"] == 9


# ------------------------------------------------------- measure.py plumbing with a fake device
class _FakeArray:
    """Host-memory stand-in for gpu_backend.memory.DeviceArray."""

    _next = [1 << 20]

    def __init__(self, shape, dtype):
        from gpu_backend.memory import BITS_DTYPE
        self.shape, self.dtype = tuple(int(s) for s in shape), dtype
        self.bits = np.zeros(self.shape, BITS_DTYPE[dtype])
        self.ptr = self._next[0]
        self._next[0] += 1 << 20

    @classmethod
    def alloc(cls, shape, dtype):
        return cls(shape, dtype)

    @classmethod
    def from_host(cls, values, dtype):
        a = cls(np.shape(values), dtype)
        a.upload(values)
        return a

    def upload(self, values):
        from gpu_backend.memory import to_bits
        self.bits[...] = to_bits(values, self.dtype).reshape(self.shape)

    def upload_bits(self, bits):
        self.bits[...] = bits

    def download_bits(self):
        return self.bits.copy()

    def poison(self, stream=0):
        from gpu_backend.memory import POISON_BITS
        self.bits[...] = POISON_BITS[self.dtype]

    def free(self):
        pass


def _fake_semantics(kernel, arrays):
    """What the real kernel would compute, for the kernels the plumbing test launches."""
    from gpu_backend.memory import bf16_bits_to_f32, f32_to_bf16_bits
    name = kernel.name
    if "copy" in name:
        arrays["Y"].bits[...] = arrays["X"].bits
    elif name.startswith("gemm"):
        A = bf16_bits_to_f32(arrays["A"].bits).astype(np.float64)
        B = bf16_bits_to_f32(arrays["B"].bits).astype(np.float64)
        arrays["C"].bits[...] = f32_to_bf16_bits((A @ B.T).astype(np.float32))
    elif name.startswith("softmax"):
        x = bf16_bits_to_f32(arrays["X"].bits).astype(np.float64)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        arrays["Y"].bits[...] = f32_to_bf16_bits((e / e.sum(axis=1, keepdims=True)).astype(np.float32))
    else:
        for n, a in arrays.items():
            if kernel.param(n).access != "read":
                a.bits[...] = 0


@pytest.fixture
def fake_device(monkeypatch):
    import calibration.measure as M
    import gpu_backend.memory as GM
    import gpu_backend.runner as GR
    import gpu_backend.timing as GT

    launches = []

    class FakeCK:
        def __init__(self, kernel, result, device=0):
            assert result.ok and kernel.arch == "sm_90a"
            self.kernel = kernel

        def prepare(self, tensors, scalars):
            for p in self.kernel.params:           # every param must be supplied
                assert p.name in tensors or p.name in scalars, p.name
            return [1], 0, dict(tensors)

        def launch_prepared(self, prepared, stream=0):
            launches.append(self.kernel.name)
            _fake_semantics(self.kernel, prepared[2])

        def unload(self):
            pass

    def fake_time(launch, *, warmup=3, reps=20, flusher=None, before_each=None, stream=0):
        for _ in range(warmup + reps):
            if before_each:
                before_each()
            launch()
        return GT.summarize([1.0] * reps, warmup, 0)

    class FakeEvent:
        def record(self, stream=0):
            pass

        def synchronize(self):
            pass

        def elapsed_ms(self, start):
            return 0.5

        def destroy(self):
            pass

    monkeypatch.setattr(GM, "DeviceArray", _FakeArray)
    monkeypatch.setattr(GM, "synchronize", lambda call="": None)
    monkeypatch.setattr(GR, "CompiledKernel", FakeCK)
    monkeypatch.setattr(GT, "time_launches", fake_time)
    monkeypatch.setattr(GT, "Event", FakeEvent)
    monkeypatch.setattr(M, "wait_or_die", lambda *a, **k: None)
    return launches


def _small_copy(m):
    """The same copy kernel on a few tiles (the registry's sizes are 256 MiB even with --quick)."""
    from calibration.micro.base import TensorArg
    from dataclasses import replace as dc_replace

    br = m.kernel.consts["BR"]
    G, T = 4, 4
    rows = G * T * br
    return dc_replace(m, shapes={"G": G, "T": T},
                      tensors={"X": TensorArg((rows, 64), "bf16", "randn"), "Y": TensorArg((rows, 64), "bf16", "poison")})


def test_run_micro_plumbing_on_a_fake_device(fake_device):
    from calibration.measure import Timer, run_micro

    by = {m.name: m for m in all_micros(4, quick=True)}
    rec = run_micro(_small_copy(by["hbm_ldg_copy"]), Timer(reps=3, warmup=1))
    assert rec["correct"] and rec["seconds"] == pytest.approx(1e-3), rec
    assert any("bitwise equal" in c for c in rec["checks"])
    rec = run_micro(by["tensor_wgmma"], Timer(reps=3, warmup=1))
    assert rec["correct"] and any("fully written" in c for c in rec["checks"]), rec
    rec = run_micro(by["launch_empty"], Timer(reps=3, warmup=1))
    assert rec["correct"] and rec["back_to_back_s"] == pytest.approx(0.5e-3 / 200)
    assert fake_device.count("launch_empty") == 1 + 4 + 200


def test_run_micro_reports_a_broken_copy(fake_device, monkeypatch):
    from calibration.measure import Timer, run_micro

    monkeypatch.setitem(globals(), "_fake_semantics", lambda kernel, arrays: None)   # the "kernel" copies nothing
    m = _small_copy({m.name: m for m in all_micros(4, quick=True)}["hbm_tma_copy"])
    rec = run_micro(m, Timer(reps=2, warmup=0))
    assert rec["correct"] is False and "differ" in rec["checks"][0], rec


def test_run_variant_plumbing_on_a_fake_device(fake_device):
    from calibration.measure import InputCache, Timer, run_variant
    from calibration.variants import softmax_kernel
    from cake_ir.compiler import compile_kernel
    from tasks.gemm.programs import gemm_wgmma_sm90a

    inputs = InputCache(softmax_rows=64)
    timer = Timer(reps=2, warmup=1)
    k = gemm_wgmma_sm90a(128, 256, 64, 4, 2)
    shape = {"M": 256, "N": 256, "K": 256}
    rec = run_variant("g", "gemm", k, compile_kernel(k), shape, inputs, timer)
    assert rec["correct"] and rec["rel_rmse"] < 1e-2 and rec["seconds"] == pytest.approx(1e-3), rec
    k = softmax_kernel(2048, 4, 4)
    rec = run_variant("s", "softmax", k, compile_kernel(k), {"M": 256}, inputs, timer)
    assert rec["correct"] and rec["rel_rmse"] < 1e-2, rec
    assert len(inputs.sets) == 2
    inputs.free()


def test_rank_variants_main_with_synthetic_measurements(tmp_path, monkeypatch):
    import importlib.util
    import pathlib

    import calibration.measure as M
    import gpu_backend.timing as T

    p = pathlib.Path(__file__).resolve().parent.parent / "bench" / "rank_variants.py"
    spec = importlib.util.spec_from_file_location("rank_variants_main", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    truth = _truth()

    def fake_variant(name, family, kernel, compiled, shape, inputs, timer, tol=1e-2, on_timeout=None):
        return {"name": name, "family": family, "shapes": dict(shape), "correct": True, "rel_rmse": 1e-3,
                "seconds": estimate(kernel, shape, truth).seconds * (1.1 if "mma" in name else 1.0)}

    class FakeInputs:
        def free(self):
            pass

    monkeypatch.setattr(M, "device_info", lambda ordinal=0: {"name": "NVIDIA H200", "sms": 132})
    monkeypatch.setattr(M, "run_variant", fake_variant)
    monkeypatch.setattr(M, "InputCache", FakeInputs)
    monkeypatch.setattr(M, "warm_compile_cache", lambda kernels, jobs=None: None)
    monkeypatch.setattr(T.L2Flusher, "for_device", classmethod(lambda cls, device=0: None))
    monkeypatch.delenv("OUT", raising=False)
    cal = tmp_path / "h200.json"
    d = F.direct(_synth(MICROS, truth), BASE, sms=SMS)
    F.write_json(cal, F.calibration_document(d.spec(BASE), sorted(d.values), "sm_90a", "h200", 1, {}))
    out = tmp_path / "rank.json"
    assert mod.main(["--quick", "--out", str(out), "--calibration", str(cal)]) == 0
    doc = json.loads(out.read_text())
    assert {"gpu", "versions", "command", "date", "rows", "spearman"} <= set(doc)
    assert doc["gpu"] == "NVIDIA H200" and doc["variants"] >= 36
    assert len(doc["rows"]) == doc["variants"]          # --quick: one GEMM shape
    sp = doc["spearman"]
    assert {"overall", "gemm", "softmax"} <= set(sp)
    # measured = the truth spec's estimate: the calibrated predictions (same spec) rank GEMMs of one kind exactly
    assert sp["gemm_wgmma"]["calibrated"] == pytest.approx(1.0)
    assert sp["softmax"]["calibrated"] == pytest.approx(1.0)
    assert all(r["pred_table_s"] > 0 and r["pred_calibrated_s"] > 0 for r in doc["rows"])


def _stg_coverage(m):
    """Which elements of each poisoned output the kernel's top-level stg statements write, evaluated
    for every CTA and every executing warp / warpgroup / thread (the micro kernels store once, at the
    end, outside loops)."""
    from cake_ir import expr as E
    from cake_ir.nodes import Access

    k = m.kernel
    grid = [E.evaluate(E.parse_index(g), dict(k.consts, **m.shapes)) for g in k.launch.grid]
    cov = {n: np.zeros(ta.shape, bool) for n, ta in m.tensors.items() if ta.init == "poison"}
    for role in k.roles:
        for st in role.body:
            if not (isinstance(st, Access) and st.op == "stg" and st.dst.buf in cov):
                continue
            reg = k.buffer(st.src.buf)
            if reg.layout == "mma_acc":
                units = [{"role_warp": w} for w in range(role.num_warps)]
            elif reg.layout == "wgmma_acc":
                units = [{"wg": g} for g in range(role.num_warps // 4)]
            elif reg.layout == "row_major" and reg.scope == "thread":
                units = [{"tid": t, "role_tid": t} for t in range(role.threads)]
            elif reg.layout == "blocked" and reg.scope == "warp":
                units = [{"role_warp": w} for w in range(role.num_warps)]
            else:
                units = [{}]
            for b in range(grid[0]):
                for u in units:
                    env = dict(k.consts, **m.shapes, **u)
                    env["bid.x"] = b
                    off = [E.evaluate(E.parse_index(o), env) for o in st.dst.offset]
                    sl = tuple(slice(o, o + s) for o, s in zip(off, st.dst.shape))
                    cov[st.dst.buf][sl] = True
    return cov


@pytest.mark.parametrize("m", [m for m in all_micros(4, quick=True) if any(t.init == "poison" for t in m.tensors.values())],
                         ids=lambda m: m.name)
def test_micro_outputs_are_fully_written(m):
    """run_micro checks every poisoned output is fully written on the GPU; make sure that holds by
    construction (a partially written output would fail the run)."""
    if m.check and m.check.startswith("copy:"):
        pytest.skip("copies are checked bitwise against their input")
    for name, c in _stg_coverage(m).items():
        assert c.all(), f"{m.name}: {name} {int((~c).sum())} of {c.size} elements never written"


@pytest.mark.parametrize("m", MICROS, ids=lambda m: m.name)
def test_micro_launch_arguments_match_the_kernel(m):
    """What run_micro hands the runner: every tensor and scalar param, buffer shapes equal to the
    declared ones (gpu_backend.runner raises ShapeMismatch otherwise), a grid that evaluates."""
    from cake_ir.nodes import ScalarParam, TensorParam
    from gpu_backend.runner import spec_from_kernel

    r = compile_kernel(m.kernel, arch="sm_90a")
    spec = spec_from_kernel(m.kernel, r)
    shapes = {n: list(t.shape) for n, t in m.tensors.items()}
    assert spec.shape_problem(shapes, m.shapes) is None
    assert {p.name for p in m.kernel.params if isinstance(p, TensorParam)} == set(m.tensors)
    assert {p.name for p in m.kernel.params if isinstance(p, ScalarParam)} == set(m.shapes)
    assert all(isinstance(v, int) for v in m.shapes.values())
    grid = spec.grid_dims(m.shapes)
    assert all(g >= 1 for g in grid)
    for p in m.kernel.params:
        if isinstance(p, ScalarParam):
            v = m.shapes[p.name]
            assert (p.min is None or v >= p.min) and v % p.divisible_by == 0, p.name
