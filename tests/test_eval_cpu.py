"""gpu_backend pieces that need no GPU: bf16 on numpy, output checks, CUDA error classes, candidate
compilation (NVRTC), interfaces, seeds; and evaluate()'s orchestration on a fake device
(tests/fake_device.py): poison, re-runs with fresh inputs, cache cheats, timing re-checks, crashes."""
import numpy as np
import pytest

import fake_device
from gpu_backend import memory
from gpu_backend.checks import check_output
from gpu_backend.driver import CudaError
from gpu_backend.errors import classify, signal_class
from gpu_backend.evaluate import derive_seed, evaluate, interface_problem
from gpu_backend.timing import summarize


# ----------------------------------------------------------------------------- bf16 and poison
def test_bf16_round_to_nearest_even():
    one = 1.0
    x = np.array([one, one + 2**-8, one + 3 * 2**-8, one + 2**-8 + 2**-20, -2.5, 3.4e38, np.inf, -np.inf],
                 dtype=np.float32)
    y = memory.bf16_bits_to_f32(memory.f32_to_bf16_bits(x))
    assert y[0] == 1.0
    assert y[1] == 1.0                       # tie -> even
    assert y[2] == one + 2**-6               # tie -> even (up)
    assert y[3] == one + 2**-7               # above the tie -> up
    assert y[4] == -2.5
    assert np.isinf(y[5])                    # rounds past the largest bf16
    assert np.isposinf(y[6]) and np.isneginf(y[7])
    nan = memory.f32_to_bf16_bits(np.array([np.nan], dtype=np.float32))
    assert np.isnan(memory.bf16_bits_to_f32(nan)).all()


def test_bf16_matches_float_rounding_exhaustively_on_a_range():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(100000) * 10).astype(np.float32)
    bits = memory.f32_to_bf16_bits(x)
    y = memory.bf16_bits_to_f32(bits)
    up = memory.bf16_bits_to_f32(bits + 1)
    down = memory.bf16_bits_to_f32(bits - 1)
    err = np.abs(y.astype(np.float64) - x)
    assert (err <= np.abs(up.astype(np.float64) - x)).all() and (err <= np.abs(down.astype(np.float64) - x)).all()
    assert np.array_equal(memory.round_to_bf16(y), y)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_poison_is_a_nan_no_arithmetic_makes(dtype):
    pat = memory.BITS_DTYPE[dtype](memory.POISON_BITS[dtype])
    val = memory.from_bits(np.array([pat]), dtype)
    with np.errstate(invalid="ignore"):
        assert np.isnan(val.astype(np.float64)).all()
    canonical = memory.to_bits(np.array([np.nan], dtype=np.float32), dtype)
    assert not memory.poison_mask(canonical, dtype).any()
    assert memory.poison_mask(np.array([pat]), dtype).all()


# ----------------------------------------------------------------------------- checks
def _bits(x):
    return memory.f32_to_bf16_bits(np.asarray(x, dtype=np.float32))


def test_check_output_classes():
    ref = np.linspace(0.1, 1.0, 64).reshape(4, 16)
    ok = check_output("Y", _bits(ref), "bf16", ref, 1e-2, 1e-2)
    assert ok.ok and ok.rel_rmse < 1e-2
    half = _bits(ref)
    half[2:] = memory.POISON_BITS["bf16"]
    r = check_output("Y", half, "bf16", ref, 1e-2)
    assert r.error_class == "unwritten_output" and r.unwritten == 32 and r.first_bad == [2, 0]
    assert "2 of 4 rows" in r.message
    nan = _bits(ref)
    nan[1, 3] = 0x7FC0
    r = check_output("Y", nan, "bf16", ref, 1e-2)
    assert r.error_class == "nan" and r.first_bad == [1, 3]
    inf = _bits(ref)
    inf[0, 0] = 0x7F80
    assert check_output("Y", inf, "bf16", ref, 1e-2).error_class == "nan"
    wrong = _bits(ref * 1.1)
    r = check_output("Y", wrong, "bf16", ref, 1e-2)
    assert r.error_class == "wrong_result" and r.rel_rmse > 0.05
    one_off = _bits(ref)
    one_off[0, 0] = _bits([0.5])[0]            # one bad element: passes RMSE, fails max-abs
    assert check_output("Y", one_off, "bf16", ref, 1e-1).ok
    assert check_output("Y", one_off, "bf16", ref, 1e-1, 1e-2).error_class == "wrong_result"


# ----------------------------------------------------------------------------- CUDA errors
class _Code:
    def __init__(self, name):
        self.name = name


@pytest.mark.parametrize("name,cls,sticky", [
    ("CUDA_ERROR_ILLEGAL_ADDRESS", "illegal_address", True),
    ("CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned", True),
    ("CUDA_ERROR_LAUNCH_FAILED", "launch_failure", True),
    ("CUDA_ERROR_ILLEGAL_INSTRUCTION", "illegal_instruction", True),
    ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "launch_out_of_resources", False),
    ("CUDA_ERROR_INVALID_VALUE", "launch_config", False),
    ("CUDA_ERROR_SOMETHING_NEW", "cuda_error", False),
])
def test_cuda_error_classes(name, cls, sticky):
    assert classify(CudaError("cuLaunchKernel", _Code(name))) == (cls, sticky)
    assert classify(f"cuCtxSynchronize failed: {name}") == (cls, sticky)


def test_signal_class():
    assert signal_class(-9) == "worker_killed_sigkill"
    assert signal_class(-11) == "worker_killed_sigsegv"
    assert signal_class(3) == "worker_died"


# ----------------------------------------------------------------------------- candidates (NVRTC, no GPU)
def test_compile_seeds_and_interfaces():
    from gpu_backend.candidate import compile_candidate
    from tasks.base import get_task
    from tasks.export_seeds import ROOT
    for task_name, seed in (("softmax", "softmax_row_n4096"), ("gemm", "gemm_wgmma_sm90a"), ("gemm", "gemm_mma_sm80")):
        text = (ROOT / task_name / "seeds" / f"{seed}.json").read_text()
        c = compile_candidate(text, "sm_90a")
        assert c.ok, c.diagnostics
        assert c.spec.cubin and c.info["arch"] == "sm_90a"
        task = get_task(task_name)
        assert interface_problem(c.spec, task, task.shapes[0]) is None
        other = get_task("gemm" if task_name == "softmax" else "softmax")
        assert "missing tensor params" in interface_problem(c.spec, other, other.shapes[0])
        again = compile_candidate(text, "sm_90a")
        assert again.info["cached"] and again.spec is c.spec


def test_compile_candidate_failures():
    from gpu_backend.candidate import compile_candidate, target_arch
    bad = compile_candidate("{not json", "sm_90a")
    assert not bad.ok and bad.error_class == "parse_error"
    from tasks.export_seeds import ROOT
    text = (ROOT / "gemm" / "seeds" / "gemm_wgmma_sm90a.json").read_text()
    assert compile_candidate(text, "sm_80").error_class == "arch_mismatch"
    assert target_arch("sm_80", "sm_90a") == "sm_90a"
    assert target_arch("sm_90a", "sm_90a") == "sm_90a"
    assert target_arch("sm_90a", "sm_89") is None
    assert target_arch("sm_89", "sm_80") is None


def test_derive_seed():
    assert derive_seed(5, 0, 0) == derive_seed(5, 0, 0)
    assert len({derive_seed(5, s, r) for s in range(4) for r in range(2)} | {derive_seed(6, 0, 0)}) == 9


def test_summarize():
    s = summarize([3.0, 1.0, 2.0, 10.0, 2.5])
    assert (s.ms_min, s.ms_median, s.ms_max, s.reps) == (1.0, 2.5, 10.0, 5)


# ----------------------------------------------------------------------------- evaluate on a fake device
SHAPES = [{"M": 1}, {"M": 7}, {"M": 30}]
BENCH = [{"M": 64}]


def _run(monkeypatch, kernel_fn, **kw):
    fake_device.install(monkeypatch, kernel_fn, **{k: kw.pop(k) for k in ("spec", "compiled_ok") if k in kw})
    kw.setdefault("shapes", SHAPES)
    kw.setdefault("bench_shapes", BENCH)
    kw.setdefault("reps", 5)
    return evaluate("{}", "softmax", 0, **kw)


def correct(i, t, s):
    t["Y"].bits[...] = fake_device.softmax_bits(t["X"].bits)


def test_fake_correct_kernel_passes(monkeypatch):
    rec = _run(monkeypatch, correct, seed=123)
    assert rec.status == "ok" and rec.stage == "profile" and rec.error_class is None, rec.message
    assert rec.seed == 123 and rec.device == "FakeGPU"
    assert len(rec.shapes) == 2 * len(SHAPES) and all(s.ok for s in rec.shapes)
    assert len({s.seed for s in rec.shapes}) == len(rec.shapes)          # fresh inputs every run
    assert rec.max_rel_rmse < 1e-2
    t = rec.timings[0]
    assert t.rechecked and t.ms_median > 0 and t.tbps > 0 and t.shape == BENCH[0]
    rec2 = _run(monkeypatch, correct, seed=123)
    assert [s.rel_rmse for s in rec2.shapes] == [s.rel_rmse for s in rec.shapes]   # reproducible
    rec3 = _run(monkeypatch, correct)
    assert rec3.seed != rec.seed or rec3.shapes[0].seed != rec.shapes[0].seed


def test_fake_half_written_output(monkeypatch):
    def half(i, t, s):
        y = fake_device.softmax_bits(t["X"].bits)
        rows = (s["M"] + 1) // 2
        t["Y"].bits[:rows] = y[:rows]
    rec = _run(monkeypatch, half)
    assert (rec.stage, rec.status, rec.error_class) == ("test", "fail", "unwritten_output")
    assert "M': 7" in rec.message and "never written" in rec.message


def test_fake_first_launch_only_is_cache_cheat(monkeypatch):
    def first_only(i, t, s):
        if i == 0:
            correct(i, t, s)
    rec = _run(monkeypatch, first_only)
    assert (rec.status, rec.error_class) == ("fail", "cache_cheat")
    assert rec.shapes[0].ok and rec.shapes[1].error_class == "unwritten_output"


def test_fake_address_keyed_cache_is_cache_cheat(monkeypatch):
    memo = {}

    def cached(i, t, s):
        key = (t["X"].ptr, s["M"])
        if key not in memo:
            memo[key] = fake_device.softmax_bits(t["X"].bits)
        t["Y"].bits[...] = memo[key]
    rec = _run(monkeypatch, cached)
    assert (rec.status, rec.error_class) == ("fail", "cache_cheat")
    # Caught on a re-run with fresh inputs at the same addresses. Which shape catches it depends on the
    # seed: a one-row shape whose row is an edge case (a constant row) has the same softmax for any
    # fresh constant, so the stale output can still be right there.
    stale = [r for r in rec.shapes if r.run == 1 and not r.ok]
    assert stale and stale[0].error_class == "wrong_result"
    assert all(r.ok for r in rec.shapes if r.run == 0)


def test_fake_skips_work_when_timed(monkeypatch):
    seen = {}

    def lazy(i, t, s):   # correct in the test stage; skips repeated inputs (as in timing loops)
        key = t["X"].bits.tobytes()
        if key in seen:
            return
        seen[key] = True
        correct(i, t, s)
    rec = _run(monkeypatch, lazy)
    assert (rec.stage, rec.status, rec.error_class) == ("profile", "fail", "cache_cheat")
    assert "timed runs" in rec.message


def test_fake_writes_input(monkeypatch):
    def clobber(i, t, s):
        correct(i, t, s)
        t["X"].bits[0, 0] ^= 1
    rec = _run(monkeypatch, clobber)
    assert rec.error_class == "input_modified"


def test_fake_nan_and_wrong(monkeypatch):
    def nan(i, t, s):
        correct(i, t, s)
        t["Y"].bits[-1, -1] = 0x7FC0
    assert _run(monkeypatch, nan).error_class == "nan"

    def wrong(i, t, s):
        x = memory.bf16_bits_to_f32(t["X"].bits).astype(np.float64)
        e = np.exp(x - x.max(-1, keepdims=True)) ** 0.9
        t["Y"].bits[...] = memory.f32_to_bf16_bits(e / e.sum(-1, keepdims=True))
    for seed in range(12):   # never cache_cheat, even when the first inputs pass by luck (constant row)
        rec = _run(monkeypatch, wrong, seed=seed)
        assert rec.error_class == "wrong_result" and rec.max_rel_rmse > 1e-2, rec.message


def test_fake_stale_values_from_other_shapes_memory(monkeypatch):
    """A kernel that replays the previous run's outputs (not by address) is still a cache cheat."""
    last = {}

    def replay(i, t, s):
        if s["M"] in last:
            t["Y"].bits[...] = last[s["M"]]
        else:
            correct(i, t, s)
            last[s["M"]] = t["Y"].bits.copy()
    rec = _run(monkeypatch, replay)
    assert rec.error_class == "cache_cheat" and "identical to the previous run" in rec.message


def test_fake_sticky_fault_is_crash(monkeypatch):
    def fault(i, t, s):
        raise CudaError("cuCtxSynchronize", _Code("CUDA_ERROR_ILLEGAL_ADDRESS"))
    rec = _run(monkeypatch, fault)
    assert (rec.stage, rec.status, rec.error_class, rec.context_lost) == ("test", "crash", "illegal_address", True)


def test_fake_refused_launch_is_error(monkeypatch):
    def refuse(i, t, s):
        raise CudaError("cuLaunchKernel", _Code("CUDA_ERROR_INVALID_VALUE"))
    rec = _run(monkeypatch, refuse)
    assert (rec.status, rec.error_class, rec.context_lost) == ("error", "launch_config", False)


def test_fake_compile_error_and_unsupported_shape(monkeypatch):
    rec = _run(monkeypatch, correct, compiled_ok=False)
    assert (rec.stage, rec.status, rec.error_class, rec.node) == ("compile", "fail", "compile_error", "/roles/0")
    spec = fake_device.softmax_spec()
    spec.scalars["M"].divisible_by = 8
    rec = _run(monkeypatch, correct, spec=spec)
    assert (rec.status, rec.error_class) == ("fail", "unsupported_shape")
    assert "not divisible by 8" in rec.message


def test_fake_declared_shape_mismatch_is_interface_error(monkeypatch):
    spec = fake_device.softmax_spec()
    spec.consts["N"] = 2048
    rec = _run(monkeypatch, correct, spec=spec)
    assert (rec.status, rec.error_class) == ("error", "interface")


def test_fake_no_profile(monkeypatch):
    rec = _run(monkeypatch, correct, profile=False)
    assert rec.status == "ok" and rec.stage == "test" and not rec.timings
