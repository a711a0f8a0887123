"""Baselines are checked like candidates (agent.baselines.check_baseline_outputs -> run_checks): a knn
baseline that returns tied neighbours in another order / with other indices passes, a wrong one fails."""
import numpy as np

from agent.baselines import check_baseline_outputs
from gpu_backend.checks import check_outputs
from tasks.knn.task import TASK as KNN


def _inputs():
    rng = np.random.default_rng(3)
    Q, M, d = 6, 64, KNN.d
    xb = rng.standard_normal((M, d)).astype(np.float16).astype(np.float32)
    xb[32:] = xb[:32]                              # every database row has an exact twin: ties everywhere
    xq = (xb[rng.integers(0, 32, Q)] + 0.05 * rng.standard_normal((Q, d))).astype(np.float16).astype(np.float32)
    return {"Xq": xq, "Xb": xb}, {"Q": Q, "M": M}


def _tied(ref_i, ref_d):
    """The reference result with every index replaced by its twin (same distance) and rows reversed."""
    I = ref_i.astype(np.int64)
    twin = np.where(I < 32, I + 32, I - 32)
    swap = ~np.array([[t in row for t in trow] for row, trow in zip(I, twin)])
    I = np.where(swap, twin, I)
    return I[:, ::-1].astype(np.int32).copy(), ref_d[:, ::-1].astype(np.float32).copy()


def test_tied_indices_pass_and_generic_check_would_not():
    inputs, shape = _inputs()
    refs = KNN.reference(inputs, shape)
    I, Dist = _tied(refs["I"], refs["Dist"])
    assert not np.array_equal(I, refs["I"])
    checks = check_baseline_outputs(KNN, {"I": I, "Dist": Dist}, refs, inputs, shape)
    assert all(c.ok for c in checks), [c.message for c in checks]
    # the old path (rel RMSE of the indices against the reference) reports this as wrong
    generic = check_outputs({"I": I.view(np.uint32), "Dist": Dist.view(np.uint32)}, {"I": "i32", "Dist": "f32"},
                            refs, KNN.tolerance.rel_rmse)
    assert not all(c.ok for c in generic)


def test_wrong_neighbour_fails():
    inputs, shape = _inputs()
    refs = KNN.reference(inputs, shape)
    I, Dist = _tied(refs["I"], refs["Dist"])
    q = 2
    far = int(np.argmax(((inputs["Xb"] - inputs["Xq"][q]) ** 2).sum(1)))
    I[q, 0] = far                                  # a far point instead of the nearest
    checks = check_baseline_outputs(KNN, {"I": I, "Dist": Dist}, refs, inputs, shape)
    bad = [c for c in checks if not c.ok]
    assert bad and bad[0].error_class == "wrong_result" and "recall" in bad[0].message


def test_missing_or_misshapen_output_fails():
    inputs, shape = _inputs()
    refs = KNN.reference(inputs, shape)
    I, Dist = _tied(refs["I"], refs["Dist"])
    assert not check_baseline_outputs(KNN, {"I": I}, refs, inputs, shape)[0].ok
    assert not check_baseline_outputs(KNN, {"I": I[:, :5], "Dist": Dist}, refs, inputs, shape)[0].ok


def test_generic_task_uses_tolerance_check():
    """A task without its own check (softmax) gets rel RMSE against the float64 reference."""
    from tasks.registry import get
    task = get("softmax").task
    shape = dict(task.shapes[0])
    inputs = task.make_inputs(shape, 0)
    refs = task.reference(inputs, shape)
    good = {n: r.astype(np.float32) for n, r in refs.items()}
    assert all(c.ok for c in check_baseline_outputs(task, good, refs, inputs, shape))
    bad = {n: np.zeros_like(r, dtype=np.float32) for n, r in refs.items()}
    assert not any(c.ok for c in check_baseline_outputs(task, bad, refs, inputs, shape))
