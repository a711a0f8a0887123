"""cakelib.kda_prefill / kda_decode: which kernel a problem gets (CPU), argument checks before any GPU
work (CPU, with torch), and on a GPU (marked) both calls against the float64 recurrence: packed
sequences, grouped value heads, both gates and state layouts, with and without initial states."""
import numpy as np
import pytest

from cakelib.kda_attention import prefill_plan


def test_plan_follows_the_measured_v_slices():
    # V-slice 32 while its CTAs fit two waves (T = 8192: H = 32 and 64), with the bulk loader and the
    # searches' 2 + 2 warps; else 128 with 8 consumers
    tp = {"warps": 1, "stages": 2, "consumers": 4}
    vs32 = {"vs": 32, **tp, "warps": 2, "consumers": 2, "copy": "bulk"}
    assert prefill_plan(32, 32, 1, True, "sm_90a", 132, 8192) == ("two_pass", {**vs32, "safe": True})
    assert prefill_plan(32, 32, 1, False, "sm_90a", 132, 8192)[1] == {**vs32, "safe": False}
    assert prefill_plan(64, 64, 1, False, "sm_90a", 132) == ("two_pass", {**vs32, "safe": False})
    assert prefill_plan(66, 66, 1, True, "sm_90a", 132)[1]["vs"] == 32         # 264 CTAs: two waves
    assert prefill_plan(68, 68, 1, True, "sm_90a", 132)[1]["vs"] == 128
    assert prefill_plan(96, 96, 1, True, "sm_90a", 132)[1] == {"vs": 128, "safe": True, **tp, "consumers": 8}
    assert prefill_plan(64, 64, 6, True, "sm_90a", 132)[1]["vs"] == 128
    assert prefill_plan(96, 96, 8, False, "sm_90a", 132)[1]["vs"] == 128
    # one long sequence at small H: the sequence-parallel form; at H = 32 (one wave at vs 32) not
    assert prefill_plan(8, 8, 1, True, "sm_90a", 132, 32768)[1]["segments"] == 64
    assert "segments" not in prefill_plan(32, 32, 1, True, "sm_90a", 132, 32768)[1]
    assert "segments" not in prefill_plan(8, 8, 4, True, "sm_90a", 132, 32768)[1]      # 8k tokens each
    from tasks.kda.two_pass import two_pass_problem
    for H, N, T in ((32, 1, 8192), (64, 1, 8192), (96, 1, 8192), (64, 6, 8192), (96, 8, 8192), (8, 1, 32768)):
        for safe in (True, False):
            p = prefill_plan(H, H, N, safe, "sm_90a", 132, T)[1]
            assert two_pass_problem(p["vs"], p["safe"], p["warps"], p["stages"], p["consumers"],
                                    p.get("segments", 0), p.get("copy", "cp_async"), "sm_90a") is None, p


def test_plan_on_ampere_uses_what_fits():
    assert prefill_plan(32, 32, 1, True, "sm_80", 108) == ("chunked", {"vs": 32, "safe": True})
    assert prefill_plan(32, 32, 1, False, "sm_80", 108)[0] == "recurrent"
    with pytest.raises(ValueError, match="multiple of H"):
        prefill_plan(3, 4, 1, True, "sm_90a", 132)


def test_cpu_tensors_are_refused_before_any_gpu_work():
    torch = pytest.importorskip("torch")
    from cakelib import kda_prefill
    T, H = 16, 2
    bf = torch.bfloat16
    args = (torch.zeros(T, H, 128, dtype=bf), torch.zeros(T, H, 128, dtype=bf), torch.zeros(T, H, 128, dtype=bf),
            torch.zeros(T, H, 128, dtype=bf), torch.zeros(T, H, dtype=bf), torch.zeros(H),
            torch.zeros(H, 128))
    with pytest.raises(TypeError, match="CUDA torch tensor"):
        kda_prefill(*args, cu_seqlens=torch.tensor([0, T], dtype=torch.int32))


def _torch_inputs(x: dict, names, dev):
    import torch
    dt = {"q": torch.bfloat16, "k": torch.bfloat16, "v": torch.bfloat16, "g": torch.bfloat16,
          "beta": torch.bfloat16, "A_log": torch.float32, "dt_bias": torch.float32, "h0": torch.float32,
          "state": torch.float32, "cu_seqlens": torch.int32, "idx": torch.int32}
    return {n: torch.as_tensor(np.asarray(x[n])).to(dev, dt[n]) for n in names}


def _rel(a, b) -> float:
    a = a.double().cpu().numpy()
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [
    {"T": 277, "N": 5, "H": 2, "HV": 4, "SAFE": 1, "VK": 1, "H0": 1, "PACK": 3},
    {"T": 200, "N": 2, "H": 2, "HV": 4, "SAFE": 0, "VK": 0, "H0": 0, "PACK": 0},
    {"T": 128, "N": 1, "H": 2, "HV": 2, "SAFE": 0, "VK": 1, "H0": 1, "PACK": 0}])
def test_prefill_matches_float64_on_gpu(shape):
    _check_prefill_on_gpu(shape)


@pytest.mark.gpu
@pytest.mark.parametrize("safe", [0, 1])
def test_sequence_parallel_plan_through_the_library_on_gpu(safe):
    # the plan for one long sequence at small H, with 2-chunk segments so that a 700-token sequence
    # has 22 segments and every carried state goes through M (long segments decay it to 0)
    kind, params = prefill_plan(2, 4, 1, bool(safe), "sm_90a", 132, 32768)
    assert kind == "two_pass" and params["segments"]
    _check_prefill_on_gpu({"T": 700, "N": 1, "H": 2, "HV": 4, "SAFE": safe, "VK": 1, "H0": 1, "PACK": 0},
                          (kind, {**params, "segments": 2}))


def _check_prefill_on_gpu(shape, plan=None):
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    torch = pytest.importorskip("torch")
    from cakelib import kda_prefill
    from tasks.kda.task import TASK
    x = TASK.make_inputs(shape, seed=21)
    ref = TASK.reference(x, shape)
    t = _torch_inputs(x, ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "h0", "cu_seqlens"), "cuda")
    o, ht = kda_prefill(t["q"], t["k"], t["v"], t["g"], t["beta"], t["A_log"], t["dt_bias"],
                        cu_seqlens=t["cu_seqlens"], initial_state=t["h0"] if shape["H0"] else None,
                        safe_gate=bool(shape["SAFE"]), state_layout="vk" if shape["VK"] else "kv", plan=plan)
    torch.cuda.synchronize()
    assert _rel(o, ref["o"]) <= 5e-3 and _rel(ht, ref["ht"]) <= 5e-3


@pytest.mark.gpu
@pytest.mark.parametrize("safe", [0, 1])
def test_decode_matches_float64_on_gpu(safe):
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    torch = pytest.importorskip("torch")
    from cakelib import kda_decode
    from tasks.kda.task import DECODE_TASK
    shape = {"B": 7, "H": 2, "HV": 4, "SAFE": safe, "VK": 1}
    x = DECODE_TASK.make_inputs(shape, seed=5)
    ref = DECODE_TASK.reference(x, shape)
    t = _torch_inputs(x, ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "state", "idx"), "cuda")
    before = t["state"].clone()
    o, pool = kda_decode(t["q"], t["k"], t["v"], t["g"], t["beta"], t["A_log"], t["dt_bias"], t["state"], t["idx"],
                         safe_gate=bool(safe))
    torch.cuda.synchronize()
    assert _rel(o, ref["o"]) <= 5e-3 and _rel(pool, ref["state_out"]) <= 5e-3
    assert torch.equal(t["state"], before)          # the caller's pool is not written
