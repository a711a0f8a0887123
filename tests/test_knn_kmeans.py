"""kNN and k-means tasks on the CPU: float64 references against brute force, the task checks catch a
wrong index / a wrong assignment / a stale centroid and accept exact ties, the workspace protocol,
and the new IR ops' lowering (selection, atomics, last_cta). GPU runs of the seeds are marked `gpu`."""
import numpy as np
import pytest

from gpu_backend.checks import run_checks
from gpu_backend.memory import to_bits
from tasks.base import get_task


def _bits(task, shape, outs):
    return ({s.name: to_bits(outs[s.name], s.dtype) for s in task.outputs(shape)},
            {s.name: s.dtype for s in task.outputs(shape)})


def _run(task, shape, x, outs):
    bits, dts = _bits(task, shape, outs)
    return run_checks(task, bits, dts, task.reference(x, shape), x, shape)


@pytest.mark.parametrize("name", ["knn", "knn_ip"])
def test_knn_reference_is_brute_force(name):
    t = get_task(name)
    shape = {"Q": 9, "M": 300}
    x = t.make_inputs(shape, 4)
    ref = t.reference(x, shape)
    q, b = x["Xq"].astype(np.float64), x["Xb"].astype(np.float64)
    s = ((q[:, None] - b[None]) ** 2).sum(-1) if name == "knn" else -(q @ b.T)
    want = np.sort(s, axis=1)[:, :t.k]
    got = ref["Dist"] if name == "knn" else -ref["Dist"]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    assert ref["I"].shape == (9, t.k)


def _knn_outs(t, shape, x):
    ref = t.reference(x, shape)
    return {"I": ref["I"].astype(np.int32), "Dist": ref["Dist"].astype(np.float32)}


def test_knn_check_catches_wrong_index_and_accepts_ties():
    t = get_task("knn")
    shape = {"Q": 40, "M": 700}
    x = t.make_inputs(shape, 2)
    outs = _knn_outs(t, shape, x)
    assert all(c.ok for c in _run(t, shape, x, outs))
    # a far-away index in the last slot: recall < 1
    bad = {k: v.copy() for k, v in outs.items()}
    d = ((x["Xq"][3].astype(np.float64) - x["Xb"].astype(np.float64)) ** 2).sum(1)
    far = int(d.argmax())
    bad["I"][3, -1] = far
    bad["Dist"][3, -1] = d[far]
    res = _run(t, shape, x, bad)
    assert not all(c.ok for c in res) and "recall" in res[0].message
    # a duplicated index is caught
    dup = {k: v.copy() for k, v in outs.items()}
    dup["I"][5, 1] = dup["I"][5, 0]
    assert not all(c.ok for c in _run(t, shape, x, dup))
    # an out-of-range index and a wrong distance are caught
    oob = {k: v.copy() for k, v in outs.items()}
    oob["I"][0, 0] = shape["M"]
    assert not all(c.ok for c in _run(t, shape, x, oob))
    wd = {k: v.copy() for k, v in outs.items()}
    wd["Dist"][1, 2] += 1.0
    assert not all(c.ok for c in _run(t, shape, x, wd))
    # an exact tie: swap a returned index for an identical database row that was not returned
    xb = x["Xb"]
    for q in range(shape["Q"]):
        for j in range(t.k):
            i = outs["I"][q, j]
            twins = np.flatnonzero((xb == xb[i]).all(1))
            others = [int(v) for v in twins if v not in outs["I"][q]]
            if others:
                tie = {k: v.copy() for k, v in outs.items()}
                tie["I"][q, j] = others[0]
                assert all(c.ok for c in _run(t, shape, x, tie))
                return
    pytest.fail("the inputs have no exact tie to test (duplicates are part of make_inputs)")


def test_knn_unwritten_output_is_caught():
    t = get_task("knn")
    shape = {"Q": 5, "M": 100}
    x = t.make_inputs(shape, 1)
    bits, dts = _bits(t, shape, _knn_outs(t, shape, x))
    bits["I"][2, 3] = np.uint32(0xA5A5A5A5)
    res = run_checks(t, bits, dts, t.reference(x, shape), x, shape)
    assert res[0].error_class == "unwritten_output"


def test_kmeans_reference_and_check():
    t = get_task("kmeans")
    shape = {"B": 2, "N": 300, "K": 9}
    x = t.make_inputs(shape, 3)
    ref = t.reference(x, shape)
    X, C = x["X"].reshape(2, 300, 128).astype(np.float64), x["C"].reshape(2, 9, 128).astype(np.float64)
    for b in range(2):
        d = ((X[b][:, None] - C[b][None]) ** 2).sum(-1)
        a = d.argmin(1)
        assert (ref["A"][b] == a).all()
        cn = ref["Cnew"].reshape(2, 9, 128)[b]
        for k in range(9):
            want = X[b][a == k].mean(0) if (a == k).any() else C[b][k]
            np.testing.assert_allclose(cn[k], want, rtol=1e-10, atol=1e-10)
        assert not (a == 8).any()          # the far centroid's cluster is empty: it keeps its centroid
    outs = {"A": ref["A"].astype(np.int32), "Cnew": ref["Cnew"].astype(np.float32)}
    assert all(c.ok for c in _run(t, shape, x, outs))
    wrong = {k: v.copy() for k, v in outs.items()}
    wrong["A"][1, 7] = (wrong["A"][1, 7] + 1) % 9      # one point to a worse centroid
    assert not all(c.ok for c in _run(t, shape, x, wrong))
    stale = {k: v.copy() for k, v in outs.items()}
    stale["Cnew"][:9] = x["C"][:9]                      # centroids not updated
    assert not all(c.ok for c in _run(t, shape, x, stale))
    tie = {k: v.copy() for k, v in outs.items()}        # centroids 0 and 1 are identical: either is right
    p = np.flatnonzero(tie["A"][0] == 0)
    if p.size:
        tie["A"][0, p[0]] = 1
        own = tie["Cnew"].copy()
        from tasks.kmeans.task import update_reference
        own[:9] = update_reference(x["X"][:300], x["C"][:9], tie["A"][0].astype(np.int64))
        tie["Cnew"] = own.astype(np.float32)
        assert all(c.ok for c in _run(t, shape, x, tie))


def test_kmeans_workspace_declared_and_in_seed_interface():
    from cake_ir.compiler import compile_kernel
    from gpu_backend.evaluate import interface_problem, workspace_specs
    from gpu_backend.runner import spec_from_kernel
    t = get_task("kmeans")
    shape = t.shapes[0]
    names = [w.name for w in workspace_specs(t, shape)]
    assert names == ["WS", "WC", "WT"]
    k = t.seed_programs()["kmeans_fused_sm80"]
    res = compile_kernel(k)
    assert res.ok
    assert interface_problem(spec_from_kernel(k, res), t, shape) is None
    # knn: the split-database path's partial lists, counters and shared bounds; every knn seed declares them
    kt = get_task("knn")
    assert [w.name for w in workspace_specs(kt, {"Q": 1, "M": 10})] == ["PV", "PI", "WT", "TH"]
    from cake_ir.compiler import compile_program
    from cake_ir.nodes import Program
    from gpu_backend.runner import spec_from_program
    for name, kk in kt.seed_programs().items():   # a Program (the wgmma search) keeps its XN / QN inside
        r = compile_program(kk) if isinstance(kk, Program) else compile_kernel(kk)
        assert r.ok, name
        spec = spec_from_program(kk, r) if isinstance(kk, Program) else spec_from_kernel(kk, r)
        assert interface_problem(spec, kt, {"Q": 1, "M": 10}) is None, name


def test_new_ops_lower_to_runtime_calls():
    from cake_ir.compiler import compile_kernel
    src = compile_kernel(get_task("kmeans").seed_programs()["kmeans_fused_sm80"], emit="cuda").cuda_source
    for call in ("cake::topk_insert<1, true>", "cake::topk_merge_quad<1, true>", "cake::red_add_shared(",
                 "cake::red_add_global(", "cake::arrive_last(", "cake::sq("):
        assert call in src, call
    # the argmin's score -2 x.c + ||c||^2 is one FFMA (no `+ 0.0f` row bias in between)
    assert "__fmaf_rn(-2.0f, acc[" in src and "cake_rb" not in src
    src = compile_kernel(get_task("knn").seed_programs()["knn_l2_mma_sm80"], emit="cuda").cuda_source
    assert "cake::topk_insert<10, true>" in src and "fmaf(-2.0f, acc[" in src
    assert "cake::quad_min(cake_tv[9])" in src     # k > 1: the quad's threshold filters the insertions


def test_topk_rule_reports_list_shape():
    from cake_ir.builder import KernelBuilder, tile
    from cake_ir.verifier import verify
    kb = KernelBuilder("t", arch="sm_80", grid=[1], threads=32)
    kb.buffer("acc", "reg", "f32", [16, 8], layout="mma_acc", scope="warp")
    kb.buffer("tv", "reg", "f32", [16, 4], layout="mma_rows", scope="warp")
    kb.buffer("ti", "reg", "f32", [16, 4], layout="mma_rows", scope="warp")    # indices must be i32
    with kb.role("main", warps=(0, 1)) as r:
        r.fill("acc", 0.0)
        r.add("topk", k=4, src=tile("acc"), vals=tile("tv"), idx=tile("ti"))
    diags = [d for d in verify(kb.build()).diagnostics if d.code == "E-TOPK-01"]
    assert diags and diags[0].node == "/roles/0/body/1/idx/buf"


def _gpu():
    from gpu_backend.driver import gpu_available
    return gpu_available()


needs_gpu = pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("task,seed", [("knn", "knn_l2_mma_sm80"), ("knn_ip", "knn_ip_mma_sm80"),
                                       ("kmeans", "kmeans_fused_sm80")])
def test_seed_passes_evaluator_on_gpu(task, seed):
    from gpu_backend.evaluate import evaluate
    t = get_task(task)
    rec = evaluate(t.seed_programs()[seed], t, profile=False, seed=1234, reruns=1)
    assert rec.status == "ok", (rec.error_class, rec.message)


@pytest.mark.gpu
@needs_gpu
def test_kmeans_sm90a_seed_on_gpu():
    from gpu_backend.evaluate import evaluate
    t = get_task("kmeans")
    rec = evaluate(t.seed_programs()["kmeans_fused_k256_sm90a"], t, profile=True, seed=7, reruns=1,
                   shapes=t.shapes + [{"B": 8, "N": 65536, "K": 256}], bench_shapes=[{"B": 8, "N": 65536, "K": 256}])
    assert rec.status == "ok", (rec.error_class, rec.message)
