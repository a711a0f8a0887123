"""The KDA decode seed in CAKE IR (tasks/kda_decode/programs.py): verifies and compiles everywhere;
on a GPU (marked) it is checked through the evaluator against the float64 recurrence on both state
layouts, both gate forms and grouped value heads."""
import pytest

from cake_ir.compiler import compile_kernel
from cake_ir.verifier import verify


def _seed():
    from tasks.kda_decode.programs import SEEDS
    return SEEDS["kda_decode_sm80"]()


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


def test_decode_seed_has_a_path_per_state_layout():
    from cake_ir.walk import statements
    k = _seed()
    where = {s.node.id: s.path for s in statements(k) if getattr(s.node, "id", None)}
    # VK = 1: S^T rows, lane-local K columns; VK = 0: S columns, a column reduction over the warp
    for node in ("gather_state", "state_times_k", "output"):
        assert "/then/" in where[node], where
    for node in ("gather_state_kv", "state_times_k_kv", "output_kv"):
        assert "/else/" in where[node], where
    src = compile_kernel(k, arch="sm_90a").cuda_source
    assert "} else {" in src and src.count("cake::warp_sum") >= 6
    from gpu_backend.runner import spec_from_kernel
    vk = spec_from_kernel(k, compile_kernel(k, arch="sm_90a")).scalars["VK"]
    assert vk.violation(0) is None and vk.violation(1) is None and vk.violation(2) is not None


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [{"B": 7, "H": 2, "HV": 4, "SAFE": 1, "VK": 1},
                                   {"B": 33, "H": 2, "HV": 2, "SAFE": 0, "VK": 1},
                                   {"B": 1, "H": 4, "HV": 4, "SAFE": 0, "VK": 0},
                                   {"B": 16, "H": 4, "HV": 8, "SAFE": 1, "VK": 0},
                                   {"B": 64, "H": 32, "HV": 32, "SAFE": 0, "VK": 1}])
def test_decode_seed_matches_float64_on_gpu(shape):
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    from cake_ir.io import dumps
    from gpu_backend.evaluate import evaluate
    from tasks.registry import get
    task = get("kda_decode").task
    rec = evaluate(dumps(_seed()), task, seed=3, name="kda_decode", shapes=[shape], profile=False, reruns=1)
    d = rec.model_dump() if hasattr(rec, "model_dump") else rec.__dict__
    assert d["status"] == "ok", d.get("message")


def test_kv_cols_task_form_verifies_and_compiles():
    """kda_decode_kv in the task's interface (pool of B slots, read-only state, separate state_out)."""
    from tasks.kda_decode.programs import kda_decode_kv
    k = kda_decode_kv()
    assert verify(k).ok
    for arch in ("sm_80", "sm_90a"):
        r = compile_kernel(k, arch=arch)
        assert r.ok, [d.short() for d in r.diagnostics]
        assert "cake::ld_index(idx, b, 0, B - 1)" in r.cuda_source and "float* __restrict__ state_out" in r.cuda_source


@pytest.mark.gpu
@pytest.mark.parametrize("params", [dict(vec=2, warps=8, blocks=2), dict(vec=1, warps=8, blocks=4)],
                         ids=["kv_c2w8", "kv_c1w8"])
@pytest.mark.parametrize("shape", [{"B": 1, "H": 4, "HV": 4, "SAFE": 0, "VK": 0},
                                   {"B": 16, "H": 4, "HV": 8, "SAFE": 1, "VK": 0},
                                   {"B": 33, "H": 2, "HV": 2, "SAFE": 0, "VK": 0}])
def test_kv_cols_matches_float64_on_gpu(params, shape):
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    from cake_ir.io import dumps
    from gpu_backend.evaluate import evaluate
    from tasks.kda_decode.programs import kda_decode_kv
    from tasks.registry import get
    task = get("kda_decode").task
    rec = evaluate(dumps(kda_decode_kv(**params)), task, seed=3, name="kda_decode", shapes=[shape], profile=False,
                   reruns=1)
    d = rec.model_dump() if hasattr(rec, "model_dump") else rec.__dict__
    assert d["status"] == "ok", d.get("message")


def test_register_estimate_counts_one_side_of_an_if_else():
    """E-RES-05 counts the tiles of an if/else's two sides once (they never live together): the seed
    fits 128 registers per thread; a use of the else-side tile S columns outside the if/else makes it
    live beside the then-side tiles again, and the rule fires."""
    import json

    from cake_ir.io import load
    k = _seed()
    assert not [d for d in verify(k).diagnostics if d.code == "E-RES-05"]
    doc = json.loads(k.model_dump_json(by_alias=True, exclude_none=True))
    doc["roles"][0]["body"].append({"op": "map", "dst": {"buf": "Sc"}, "expr": "Sc * 2"})
    k2, diags = load(doc)
    assert k2 is not None, diags
    assert [d for d in verify(k2).diagnostics if d.code == "E-RES-05"]
