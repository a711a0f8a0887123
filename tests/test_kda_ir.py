"""The KDA prefill seed in CAKE IR (tasks/kda/programs.py): verifies and compiles everywhere; on a GPU
(marked) the task's correctness matrix runs through the evaluator against the float64 recurrence,
and a causality check perturbs one token and compares outputs bit for bit."""
import numpy as np
import pytest

from cake_ir.compiler import compile_kernel
from cake_ir.verifier import verify


def _seed():
    from tasks.kda.programs import SEEDS
    return SEEDS["kda_recurrent_sm80"]()


def test_prefill_seed_verifies_and_compiles():
    k = _seed()
    assert not [d for d in verify(k).diagnostics if d.severity == "error"]
    for arch in ("sm_80", "sm_90a"):
        r = compile_kernel(k, arch=arch)
        assert r.ok, [d.short() for d in r.diagnostics]
        assert r.resources.get("spill_store_bytes", 1) == 0
        src = r.cuda_source
        # sequence bounds come from cu_seqlens, checked at run time; the token stream is staged
        assert "cake::ld_index(cu_seqlens, n + 1, 0, T)" in src
        assert "cake::cp_async16" in src and "cake::cp_async_wait<0>()" in src


@pytest.mark.parametrize("params", [{"vw": 8, "vsplit": 2, "chunk": 64}, {"vw": 8, "vsplit": 16, "chunk": 32}])
def test_family_points_compile(params):
    from tasks.kda.programs import FAMILIES
    fam = FAMILIES["kda_recurrent_sm80"]
    assert fam["check"](params)
    k = fam["make"](**params, arch="sm_90a")
    assert not [d for d in verify(k).diagnostics if d.severity == "error"]
    r = compile_kernel(k, arch="sm_90a")
    assert r.ok and r.resources.get("spill_store_bytes", 1) == 0, [d.short() for d in r.diagnostics]


def test_prefill_has_a_path_per_state_layout():
    from cake_ir.walk import statements
    where = {s.node.id: s.path for s in statements(_seed()) if getattr(s.node, "id", None)}
    for node in ("load_h0", "chunk_loop", "state_times_k", "store_ht"):
        assert "/then/" in where[node] and "/else/" in where[node + "_kv"], where


def test_else_attaches_to_the_if_just_closed():
    """Regression: else_() used to attach to the last if_ opened anywhere (one nested in the then-branch)."""
    from cake_ir.builder import KernelBuilder
    kb = KernelBuilder("x", arch="sm_80", grid=[1], threads=32)
    with kb.role("main", warps=(0, 1)) as r:
        with r.if_("tid < 4", id="outer"):
            with r.if_("tid < 2", id="inner"):
                r.sync("syncwarp")
        with r.else_():
            r.sync("syncwarp")
    body = kb.doc["roles"][0]["body"]
    assert "else" in body[0] and "else" not in body[0]["then"][0]
    with pytest.raises(ValueError):
        with kb.role("other", warps=(1, 1)) as r2:
            r2.sync("syncwarp")
            with r2.else_():
                pass


def _gpu():
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(7))
def test_prefill_matches_float64_on_gpu(i):
    """Each shape of the correctness matrix (tasks/kda/shapes.py PREFILL_TEST): both gates, both
    layouts, with and without h0, T not a multiple of the chunk, packs of 1..65-token sequences,
    grouped value heads; gates near the bound and very negative come from make_inputs."""
    _gpu()
    from cake_ir.io import dumps
    from gpu_backend.evaluate import evaluate
    from tasks.kda.shapes import PREFILL_TEST
    from tasks.registry import get
    task = get("kda").task
    rec = evaluate(dumps(_seed()), task, seed=5 + i, name="kda", shapes=[PREFILL_TEST[i]], profile=False, reruns=1)
    assert rec.status == "ok", rec.message


@pytest.mark.gpu
def test_prefill_is_causal_on_gpu():
    """Perturbing token j changes no output before j (bit for bit) and no other sequence's output."""
    _gpu()
    from cake_ir.io import load
    from gpu_backend.driver import arch_of, context, properties
    from gpu_backend.memory import DeviceArray, synchronize
    from gpu_backend.runner import CompiledKernel
    from tasks.kda.shapes import PREFILL_TEST
    from tasks.kda.task import TASK
    context(0)
    arch = arch_of(properties(0))
    k = _seed().model_copy(update={"arch": arch})
    ck = CompiledKernel(k, compile_kernel(k, arch=arch))
    shape = dict(PREFILL_TEST[2])                 # pack (1, 15, 16, 17, 63, 65): 177 tokens, HV = 4
    x = TASK.make_inputs(shape, seed=1)
    dtypes = {s.name: s.dtype for s in TASK.inputs(shape)}

    def run(inputs):
        arrs = {n: DeviceArray.from_host(a, dtypes[n]) for n, a in inputs.items()}
        o = DeviceArray.alloc((shape["T"], shape["HV"], 128), "bf16")
        ht = DeviceArray.alloc(TASK._state_shape(shape), "f32")
        ck({**arrs, "o": o, "ht": ht}, TASK.scalars(shape))
        synchronize()
        out = o.download_bits()
        for a in (*arrs.values(), o, ht):
            a.free()
        return out

    base = run(x)
    cu = x["cu_seqlens"]
    j = int(cu[4]) + 30                          # inside the 63-token sequence [cu[4], cu[5])
    y = {n: a.copy() for n, a in x.items()}
    for n in ("q", "k", "v", "g"):
        y[n][j] = -y[n][j] + 0.5
    y["beta"][j] = -y["beta"][j]
    pert = run(y)
    assert np.array_equal(pert[:j], base[:j])                 # nothing before j moved
    assert np.array_equal(pert[cu[5]:], base[cu[5]:])         # the next sequence did not move
    assert not np.array_equal(pert[j:cu[5]], base[j:cu[5]])   # and the perturbation is seen
