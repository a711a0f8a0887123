"""The KDA decode seed in CAKE IR (tasks/kda_decode/programs.py): verifies and compiles everywhere;
on a GPU (marked) it is checked through the evaluator against the float64 recurrence on the [P, HV,
V, K] state layout, both gate forms and grouped value heads."""
import pytest

from cake_ir.compiler import compile_kernel
from cake_ir.verifier import verify


def _seed():
    from tasks.kda_decode.programs import SEEDS
    return SEEDS["kda_decode_vk_sm80"]()


def test_decode_seed_verifies_and_compiles():
    k = _seed()
    assert verify(k).ok
    for arch in ("sm_80", "sm_90a"):
        r = compile_kernel(k, arch=arch)
        assert r.ok, [d.short() for d in r.diagnostics]
        assert r.resources.get("spill_store_bytes", 1) == 0
        src = r.cuda_source
        assert "cake::ld_index(idx, b, 0, B - 1)" in src          # the pool slot is read, bounded, trapped
        assert "cake::warp_sum" in src                             # reductions over K stay in the warp


def test_decode_seed_refuses_the_kv_layout():
    from gpu_backend.runner import spec_from_kernel
    k = _seed()
    spec = spec_from_kernel(k, compile_kernel(k, arch="sm_90a"))
    assert spec.scalars["VK"].violation(0) is not None and spec.scalars["VK"].violation(1) is None


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [{"B": 7, "H": 2, "HV": 4, "SAFE": 1, "VK": 1},
                                   {"B": 33, "H": 2, "HV": 2, "SAFE": 0, "VK": 1},
                                   {"B": 64, "H": 32, "HV": 32, "SAFE": 0, "VK": 1}])
def test_decode_seed_matches_float64_on_gpu(shape):
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    from cake_ir.io import dumps
    from gpu_backend.evaluate import evaluate
    from tasks.registry import get
    task = get("kda_decode").task
    rec = evaluate(dumps(_seed()), task, seed=3, name="kda_decode_vk", shapes=[shape], profile=False, reruns=1)
    d = rec.model_dump() if hasattr(rec, "model_dump") else rec.__dict__
    assert d["status"] == "ok", d.get("message")
