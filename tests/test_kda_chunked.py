"""The chunked KDA prefills (tasks/kda/chunked.py, per V-slice and gate form): they verify and compile
(sm_80 too where their shared memory fits); on a GPU (marked) they are checked through the evaluator
against the float64 recurrence on the shapes their scalar facts admit (both state layouts, with and
without initial state, packed sequences, grouped value heads, the task's extreme gates)."""
import pytest

from cake_ir.compiler import compile_kernel
from cake_ir.verifier import verify


# pipeline depth / warp-role split points other than 4 producers x 4 consumers (the search's space)
SPLITS = [(2, 2), (3, 4)]
SAFE_NAMES = (["kda_chunk16_ws_vs32", "kda_chunk16_ws_vs64", "kda_chunk16_ws_vs128"]
              + [f"kda_chunk16_ws_vs32_p{p}c{c}" for p, c in SPLITS])
SOFTPLUS_NAMES = (["kda_chunk16_ws_vs32_softplus", "kda_chunk16_ws_vs64_softplus"]
                  + [f"kda_chunk16_ws_vs64_softplus_p{p}c{c}" for p, c in SPLITS])
NAMES = SAFE_NAMES + SOFTPLUS_NAMES
AMPERE_FITS = {"kda_chunk16_ws_vs32"} | {n for n in NAMES if "_p" in n}


def _kernels():
    from functools import partial

    from tasks.kda import chunked
    return {**{f"kda_chunk16_ws_vs{vs}": partial(chunked.kda_chunk16_ws, vs=vs) for vs in (32, 64, 128)},
            **{f"kda_chunk16_ws_vs{vs}_softplus": partial(chunked.kda_chunk16_ws, vs=vs, safe=False)
               for vs in (32, 64)},
            **{f"kda_chunk16_ws_vs32_p{p}c{c}": partial(chunked.kda_chunk16_ws, vs=32, producers=p, consumers=c)
               for p, c in SPLITS},
            **{f"kda_chunk16_ws_vs64_softplus_p{p}c{c}": partial(chunked.kda_chunk16_ws, vs=64, safe=False,
                                                                  producers=p, consumers=c) for p, c in SPLITS}}


def test_warp_role_split_too_wide_for_the_register_file_is_refused():
    """12 warps leave a producer fewer than the 235 registers its tiles hold: the verifier says so."""
    from tasks.kda.chunked import kda_chunk16_ws
    res = verify(kda_chunk16_ws("sm_90a", vs=64, producers=4, consumers=8))
    assert not res.ok and any(d.code == "E-RES-05" and "prod" in d.message for d in res.diagnostics)
    with pytest.raises(ValueError, match="multiples of 8"):
        kda_chunk16_ws("sm_90a", vs=32, consumers=8)


@pytest.mark.parametrize("name", NAMES)
def test_chunked_verifies_and_compiles(name):
    # V-slices 64 and 128 and the softplus form with 4 chunks in flight need Hopper's shared memory
    # (179 - 222 KB): on sm_80 the verifier says so; 2 or 3 in flight fit an A100's 163 KB
    archs = ("sm_80", "sm_90a") if name in AMPERE_FITS else ("sm_90a",)
    if len(archs) == 1:
        assert "E-RES-01" in {d.code for d in verify(_kernels()[name](arch="sm_80")).diagnostics}
    k = _kernels()[name](arch=archs[0])
    assert not [d for d in verify(k).diagnostics if d.severity == "error"]
    for arch in archs:
        r = compile_kernel(k, arch=arch)
        assert r.ok, [d.short() for d in r.diagnostics if d.severity == "error"]
        assert r.resources["spill_store_bytes"] == 0
        src = r.cuda_source
        assert "cake::mma_16816_bf16" in src and "ldmatrix_x4_trans" in src and "< (int)(eos)" in src


@pytest.mark.parametrize("name", NAMES)
def test_chunked_refuses_the_shapes_it_does_not_do(name):
    from gpu_backend.runner import spec_from_kernel
    k = _kernels()[name](arch="sm_90a")
    spec = spec_from_kernel(k, compile_kernel(k, arch="sm_90a"))
    safe = name in SAFE_NAMES
    assert spec.scalars["SAFE"].violation(int(not safe)) is not None and spec.scalars["SAFE"].violation(int(safe)) is None
    assert spec.scalars["VK"].violation(1) is None and spec.scalars["H0"].violation(1) is None


SOFTPLUS_SHAPES = [
    {"T": 100, "N": 1, "H": 2, "HV": 2, "SAFE": 0, "VK": 0, "H0": 1, "PACK": 0},
    {"T": 177, "N": 6, "H": 2, "HV": 4, "SAFE": 0, "VK": 1, "H0": 1, "PACK": 2},
    {"T": 409, "N": 5, "H": 1, "HV": 2, "SAFE": 0, "VK": 0, "H0": 0, "PACK": 4},
    {"T": 8192, "N": 1, "H": 4, "HV": 4, "SAFE": 0, "VK": 1, "H0": 1, "PACK": 0}]


@pytest.mark.gpu
@pytest.mark.parametrize("name", SOFTPLUS_NAMES)
@pytest.mark.parametrize("shape", SOFTPLUS_SHAPES)
def test_chunked_softplus_matches_float64_on_gpu(name, shape):
    """The softplus gate, with the task's very negative and near-zero gates in every shape."""
    test_chunked_matches_float64_on_gpu(name, shape)


@pytest.mark.gpu
@pytest.mark.parametrize("name", SAFE_NAMES)
@pytest.mark.parametrize("shape", [
    {"T": 128, "N": 1, "H": 2, "HV": 2, "SAFE": 1, "VK": 0, "H0": 0, "PACK": 0},
    {"T": 200, "N": 2, "H": 2, "HV": 4, "SAFE": 1, "VK": 0, "H0": 0, "PACK": 0},
    {"T": 177, "N": 6, "H": 2, "HV": 4, "SAFE": 1, "VK": 0, "H0": 0, "PACK": 2},
    {"T": 277, "N": 5, "H": 2, "HV": 2, "SAFE": 1, "VK": 1, "H0": 1, "PACK": 3},
    {"T": 8192, "N": 1, "H": 4, "HV": 4, "SAFE": 1, "VK": 1, "H0": 1, "PACK": 0}])
def test_chunked_matches_float64_on_gpu(name, shape):
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    from cake_ir.io import dumps
    from gpu_backend.evaluate import evaluate
    from tasks.registry import get
    rec = evaluate(dumps(_kernels()[name](arch="sm_90a")), get("kda").task, seed=9, name=name,
                   shapes=[shape], profile=False, reruns=1)
    assert rec.status == "ok", rec.message
