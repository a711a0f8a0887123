"""The evaluator on a real GPU (skipped cleanly without one): device memory, timing, and every seed
program evaluating correct, in-process and through the worker pool."""
import numpy as np
import pytest

from gpu_backend.driver import gpu_available

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")]

SEEDS = [("softmax", "softmax_row_n4096"), ("gemm", "gemm_wgmma_sm90a"), ("gemm", "gemm_mma_sm80")]


def _seed_text(task, name):
    from tasks.export_seeds import ROOT
    return (ROOT / task / "seeds" / f"{name}.json").read_text()


def test_device_memory_roundtrip_and_poison():
    from gpu_backend import memory
    from gpu_backend.driver import context
    context(0)
    x = memory.round_to_bf16(np.random.default_rng(0).standard_normal((33, 65)).astype(np.float32))
    with memory.DeviceArray.from_host(x, "bf16") as a:
        assert np.array_equal(a.download(), x)
        a.poison()
        memory.synchronize()
        assert memory.poison_mask(a.download_bits(), "bf16").all()
    with memory.DeviceArray.alloc((1000,), "f32") as b:
        b.poison()
        memory.synchronize()
        bits = b.download_bits()
        assert memory.poison_mask(bits, "f32").all() and np.isnan(b.download()).all()


def test_timing_of_a_seed():
    from cake_ir.io import load
    from gpu_backend.candidate import compile_candidate
    from gpu_backend.driver import arch_of, context, properties
    from gpu_backend.memory import Arena
    from gpu_backend.runner import CompiledKernel
    from gpu_backend.timing import L2Flusher, time_launches
    context(0)
    c = compile_candidate(_seed_text("softmax", "softmax_row_n4096"), arch_of(properties(0)))
    ck = CompiledKernel.from_spec(c.spec)
    with Arena() as arena:
        X, Y = arena.alloc((4096, 4096), "bf16"), arena.alloc((4096, 4096), "bf16")
        X.upload(np.ones((4096, 4096), np.float32))
        prepared = ck.prepare({"X": X, "Y": Y}, {"M": 4096})
        flusher = L2Flusher.for_device(0)
        assert flusher.nbytes >= properties(0)["l2_bytes"]
        st = time_launches(lambda: ck.launch_prepared(prepared), warmup=2, reps=15, flusher=flusher)
    assert 0 < st.ms_min <= st.ms_median <= st.ms_max < 100 and st.reps == 15
    ck.unload()


@pytest.mark.parametrize("task,name", SEEDS)
def test_seed_evaluates_correct_in_process(task, name):
    from gpu_backend.evaluate import evaluate
    rec = evaluate(_seed_text(task, name), task, 0, reps=10, warmup=2)
    assert rec.status == "ok", rec.short()
    assert rec.stage == "profile" and rec.error_class is None
    assert all(s.ok for s in rec.shapes) and len(rec.shapes) >= 6
    assert rec.max_rel_rmse < 1e-2
    t = rec.timings[0]
    assert t.rechecked and t.ms_median > 0 and t.flush_bytes > 0
    assert (t.tflops if task == "gemm" else t.tbps) > 0


def test_fresh_seed_per_evaluation_and_reproducible_seed():
    from gpu_backend.evaluate import evaluate
    text = _seed_text("softmax", "softmax_row_n4096")
    a = evaluate(text, "softmax", 0, profile=False)
    b = evaluate(text, "softmax", 0, profile=False)
    assert a.ok and b.ok and a.seed != b.seed
    c = evaluate(text, "softmax", 0, profile=False, seed=a.seed)
    assert [s.rel_rmse for s in c.shapes] == [s.rel_rmse for s in a.shapes]


def test_seeds_through_worker_pool():
    from gpu_backend.worker import WorkerPool
    jobs = [{"candidate": _seed_text(t, n), "task": t, "name": n, "reps": 10, "warmup": 2} for t, n in SEEDS]
    with WorkerPool(gpus=[0]) as pool:
        recs = pool.run(jobs)
    for r in recs:
        assert r.status == "ok", r.short()
        assert r.timings and r.timings[0].rechecked and r.gpu == 0 and r.device


def test_input_pool_draws_cached_sets_and_the_bench_data_is_shared(tmp_path, monkeypatch):
    """The agent's fast test: inputs from a fixed pool per shape (the seed picks the set, the re-run the
    next one), references built once and then read from the disk cache; timing on bench inputs that a
    second evaluation (another candidate of the run) finds already built."""
    from gpu_backend import evaluate as ev
    from gpu_backend.task_data import DiskStore, TaskData, pool_seed
    big = 16 << 30       # room for every shape's sets: nothing is evicted (softmax's bench shape is ~0.8 GB)
    monkeypatch.setattr(ev, "DATA", TaskData(big, DiskStore(tmp_path, big)))
    text = _seed_text("softmax", "softmax_row_n4096")
    a = ev.evaluate(text, "softmax", 0, seed=5, input_pool=4, bench_seed=11, reps=5, warmup=1)
    assert a.ok, a.short()
    for s in a.shapes:
        assert s.seed == pool_seed("softmax", s.shape, (5 + s.run) % 4)
    built = ev.DATA.built
    b = ev.evaluate(text, "softmax", 0, seed=5, input_pool=4, bench_seed=11, reps=5, warmup=1)
    assert b.ok and ev.DATA.built == built                      # nothing built again
    assert [s.rel_rmse for s in b.shapes] == [s.rel_rmse for s in a.shapes]
    monkeypatch.setattr(ev, "DATA", TaskData(big, DiskStore(tmp_path, big)))   # a new worker
    c = ev.evaluate(text, "softmax", 0, seed=6, input_pool=4, bench_seed=11, reps=5, warmup=1)
    shapes = {tuple(sorted(s.shape.items())) for s in c.shapes}
    assert c.ok and ev.DATA.built == len(shapes)                # per shape only the set no earlier run drew
