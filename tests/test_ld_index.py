"""ld(T, i, lo, hi): run-time i32 index reads in let values (state-pool gathers, cu_seqlens offsets) --
facts, the bounds proof they enable, rule E-LDX-01, lowering, NVRTC, cost model, and (GPU) a gather."""
import json
import pathlib

import numpy as np
import pytest

from cake_ir import expr as E
from cake_ir.compiler import compile_kernel
from cake_ir.io import load
from cake_ir.verifier import verify

FIX = pathlib.Path(__file__).resolve().parent.parent / "rules" / "fixtures" / "E-LDX-01"


def _gather():
    k, diags = load(json.loads((FIX / "pass.json").read_text())["kernel"])
    assert k is not None, diags
    return k


def _with_let(k, value):
    doc = json.loads(k.model_dump_json(by_alias=True, exclude_none=True))
    doc["roles"][0]["body"][0]["value"] = value
    out, diags = load(doc)
    assert out is not None, diags
    return out


def test_ld_facts_are_its_declared_range():
    f = E.facts(E.parse_index("ld(idx, b, 0, 7) * 2 + 1"), {"b": E.Fact(0, 3, 1)})
    assert (f.lo, f.hi) == (1, 15)
    with pytest.raises(E.ExprError):
        E.evaluate(E.parse_index("ld(idx, 0, 0, 7)"), {"idx": 0})   # a device read has no host value


def test_gather_verifies_and_lowers_to_a_trapping_read():
    k = _gather()
    assert verify(k).ok
    for arch in ("sm_80", "sm_90a"):
        r = compile_kernel(k, arch=arch)
        assert r.ok, [d.short() for d in r.diagnostics]
        assert "cake::ld_index(idx, blockIdx.x, 0, P - 1)" in r.cuda_source
    from cake_ir.cost import estimate
    rep = estimate(k, {"B": 64, "P": 100})
    assert rep.seconds > 0 and not any("internal error" in a for a in rep.assumptions)


def test_a_wider_declared_range_no_longer_proves_the_row_load():
    k = _with_let(_gather(), "ld(idx, bid.x, 0, P)")   # slot may be P: the unpredicated Src row load is unsafe
    codes = {d.code for d in verify(k).diagnostics if d.severity == "error"}
    assert "E-CPY-03" in codes


@pytest.mark.parametrize("where,value,msg", [
    ("let", "ld(Src, bid.x, 0, P - 1)", "i32 tensor param"),
    ("let", "ld(idx, bid.x - 1, 0, P - 1)", "not provably >= 0"),
])
def test_bad_ld_is_reported_at_the_let(where, value, msg):
    res = verify(_with_let(_gather(), value))
    hits = [d for d in res.diagnostics if d.code == "E-LDX-01"]
    assert hits and hits[0].node == "/roles/0/body/0/value" and msg in hits[0].message, \
        [d.short() for d in res.diagnostics]


def test_ld_outside_a_let_is_reported():
    doc = json.loads(_gather().model_dump_json(by_alias=True, exclude_none=True))
    doc["roles"][0]["body"][2]["dst"]["offset"][0] = "ld(idx, bid.x, 0, B - 1)"
    k, diags = load(doc)
    assert k is not None, diags
    hits = [d for d in verify(k).diagnostics if d.code == "E-LDX-01"]
    assert any(d.node == "/roles/0/body/2/dst/offset/0" for d in hits), [d.short() for d in hits]


@pytest.mark.gpu
def test_gather_on_gpu():
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    from gpu_backend.driver import arch_of, context, properties
    from gpu_backend.memory import DeviceArray, synchronize
    from gpu_backend.runner import CompiledKernel
    context(0)
    arch = arch_of(properties(0))         # an sm_80 cubin does not load on sm_90 (no PTX in it)
    k = _gather().model_copy(update={"arch": arch})
    res = compile_kernel(k, arch=arch)
    ck = CompiledKernel(k, res)
    rng = np.random.default_rng(0)
    B, P = 37, 50
    src = rng.standard_normal((P, 128)).astype(np.float32)
    idx = rng.permutation(P)[:B].astype(np.int32)
    with DeviceArray.from_host(src, "f32") as s, DeviceArray.from_host(idx, "i32") as i, \
            DeviceArray.alloc((B, 128), "f32") as d:
        ck({"idx": i, "Src": s, "Dst": d}, {"B": B, "P": P})
        synchronize()
        np.testing.assert_array_equal(d.download(), src[idx])


def test_ld_estimate_feeds_the_cost_model_only():
    """ld(T, i, lo, hi, est): facts keep [lo, hi], the C call drops est, the cost model runs loops with
    est where lo (0 tokens of a packed sequence) would predict no work at all."""
    f = E.facts(E.parse_index("ld(cu, n, 0, 100, 50)"), {"n": E.Fact(0, 3, 1)})
    assert (f.lo, f.hi) == (0, 100)
    assert E.to_c(E.parse_index("ld(cu, n, 0, T, n * 8)"), lambda v: v.name) == "cake::ld_index(cu, n, 0, T)"
    with pytest.raises(E.ExprError):
        E.parse_index("ld(cu, n, 0, T, 1, 2)")
    from cake_ir.cost import estimate
    from tasks.kda.programs import kda_recurrent
    from tasks.kda.shapes import PREFILL_BENCH
    from tasks.kda.task import TASK
    k = kda_recurrent(arch="sm_90a")
    scal = TASK.scalars(PREFILL_BENCH[0])                     # 8192 tokens, one sequence
    with_est = estimate(k, scal).seconds
    doc = json.loads(k.model_dump_json(by_alias=True, exclude_none=True))
    for st in doc["roles"][0]["body"]:
        if st.get("op") == "let" and st["value"].startswith("ld("):
            st["value"] = st["value"].rsplit(",", 1)[0].rsplit(",", 1)[0] + ", T)"   # drop the estimate
    no_est, diags = load(doc)
    assert no_est is not None, diags
    assert "ld(cu_seqlens, n, 0, T)" in [s["value"] for s in doc["roles"][0]["body"] if s.get("op") == "let"]
    assert with_est > 100 * estimate(no_est, scal).seconds     # 8192 tokens of work vs none
