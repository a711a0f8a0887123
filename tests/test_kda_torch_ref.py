"""tasks/kda/torch_ref.py, the float64 torch recurrence the KDA GPU benchmarks check kernels against,
equals the numpy reference of tasks/kda/reference.py (on the CPU; skipped without torch)."""
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))


def test_prefill_reference_matches_numpy_in_both_layouts_and_gates():
    from kda_prefill import self_check
    assert self_check(device="cpu") < 1e-10


@pytest.mark.parametrize("shape", [{"B": 7, "H": 2, "HV": 4, "SAFE": 1, "VK": 1},
                                   {"B": 5, "H": 2, "HV": 2, "SAFE": 0, "VK": 1}])
def test_decode_step_matches_numpy(shape):
    from tasks.kda.torch_ref import activate, step
    from tasks.kda.task import DECODE_TASK
    x = DECODE_TASK.make_inputs(shape, seed=4)
    ref = DECODE_TASK.reference(x, shape)
    t = {n: torch.as_tensor(a) for n, a in x.items()}
    idx = t["idx"].long()
    S, o = step(t["state"][idx].double(), *activate(t, t["A_log"], t["dt_bias"], bool(shape["SAFE"])))
    pool = t["state"].double().clone()
    pool[idx] = S
    assert np.abs(o.numpy() - ref["o"]).max() < 1e-12 * max(1.0, np.abs(ref["o"]).max())
    assert np.abs(pool.numpy() - ref["state_out"]).max() < 1e-12 * max(1.0, np.abs(ref["state_out"]).max())


def test_reference_on_device_is_the_tasks_numpy_reference():
    """What KdaPrefillTask.reference returns for large shapes on a GPU: the same dict, here on the CPU,
    in the [N, HV, K, V] layout with initial states."""
    from tasks.kda.task import TASK
    from tasks.kda.torch_ref import reference_on_device
    shape = {"T": 90, "N": 3, "H": 2, "HV": 4, "SAFE": 0, "VK": 0, "H0": 1, "PACK": 0}
    x = TASK.make_inputs(shape, seed=8)
    ref, got = TASK.reference(x, shape, method="recurrent"), reference_on_device(x, shape, "cpu")
    for n in ("o", "ht"):
        assert got[n].shape == ref[n].shape
        assert np.linalg.norm(got[n] - ref[n]) <= 1e-10 * np.linalg.norm(ref[n])
