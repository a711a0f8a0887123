"""gpu_backend.evaluate.BenchData: a worker builds a timed shape's inputs and reference once per run seed
(every candidate of a run is timed on the same data), computes the reference only when asked, and stays
under its byte bound."""
import numpy as np

from gpu_backend.evaluate import BenchData


class CountingTask:
    name = "counting"

    def __init__(self):
        self.made, self.refs = 0, 0

    def make_inputs(self, shape, seed):
        self.made += 1
        return {"x": np.random.default_rng(seed).standard_normal(shape["n"]).astype(np.float32)}

    def reference(self, inputs, shape):
        self.refs += 1
        return {"y": inputs["x"].astype(np.float64) * 2}


def test_same_seed_reuses_inputs_and_reference():
    task, cache = CountingTask(), BenchData(1 << 30)
    a, ref_a = cache.get(task, {"n": 100}, 7)
    assert task.refs == 0                       # computed on first use only
    ya = ref_a()["y"]
    b, ref_b = cache.get(task, {"n": 100}, 7)
    assert b is a and ref_b()["y"] is ya
    assert (task.made, task.refs) == (1, 1)
    np.testing.assert_array_equal(ya, a["x"] * 2.0)


def test_other_seed_or_shape_is_new_data():
    task, cache = CountingTask(), BenchData(1 << 30)
    a, _ = cache.get(task, {"n": 100}, 7)
    b, _ = cache.get(task, {"n": 100}, 8)
    c, _ = cache.get(task, {"n": 50}, 7)
    assert task.made == 3
    assert not np.array_equal(a["x"], b["x"]) and c["x"].shape == (50,)


def test_byte_bound_evicts_least_recently_used_but_keeps_the_one_in_use():
    task = CountingTask()
    cache = BenchData(max_bytes=3 * 4000)           # three inputs of 1000 float32
    for seed in range(3):
        cache.get(task, {"n": 1000}, seed)
    cache.get(task, {"n": 1000}, 0)                 # 0 is now the most recent
    _, refs = cache.get(task, {"n": 1000}, 3)       # over the bound: 1, the least recent, goes
    assert cache.nbytes() <= 3 * 4000
    cache.get(task, {"n": 1000}, 0)
    assert task.made == 4                           # 0 was still there
    refs()                                          # + 8000 bytes of float64: more evictions, not of 3
    x3, _ = cache.get(task, {"n": 1000}, 3)
    assert task.made == 4 and cache.nbytes() <= 3 * 4000 + 8000
    huge = BenchData(max_bytes=10)                  # one item larger than the bound is still served
    x, r = huge.get(task, {"n": 1000}, 9)
    assert r()["y"].shape == (1000,)
