"""Scale-out through Ray: a local Ray runtime started here, and a dry-run campaign (`agent.run
--ray-address`) whose compile jobs run in Ray actors. Skipped when the optional `ray` extra is not
installed (CI installs only [dev])."""
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ray_cluster():
    import shutil
    import tempfile
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")        # loopback only; no token file in $HOME
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")           # AF_UNIX socket paths are short
    old = os.environ.get("PYTHONPATH")
    # the actors import agent/ and the worker double from tests/
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tests"), old]))
    # two *declared* GPUs (Ray schedules by resource count; there is no GPU here): the GPU-path test
    # below runs a worker double on them
    ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False,
                   _temp_dir=tmp, ignore_reinit_error=True)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAKE_")}
    env.update(CAKE_HOME=str(tmp_path / "home"), CAKE_LIBRARY_DIR=str(tmp_path / "lib"),
               CAKE_CACHE_DIR=str(tmp_path / "cubin"), RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    env.update(extra)
    return env


def test_dry_run_campaign_through_ray_actors(tmp_path, ray_cluster):
    env = _env(tmp_path)
    p = subprocess.run([sys.executable, "-m", "agent.run", "--task", "softmax", "--dry-run", "--max-candidates", "6",
                        "--ray-address", ray_cluster, "--compile-workers", "2", "--run-id", "ray1", "--plain"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "(ray)" in p.stdout
    con = sqlite3.connect(tmp_path / "home" / "cake.db")
    execs = [r[0] for r in con.execute("select executor from evaluations where stage='compile'")]
    assert execs and all(e.startswith("ray:cpu:") for e in execs)
    pids = {e.rsplit(":", 1)[1] for e in execs}
    assert str(os.getpid()) not in pids
    n = con.execute("select count(*) from candidates where run_id='ray1'").fetchone()[0]
    assert n == 6
    assert json.loads(con.execute("select summary from runs where id='ray1'").fetchone()[0])["best"]["hash"]


def test_gpu_path_through_ray_gpu_actors(tmp_path, ray_cluster):
    """One num_gpus=1 actor per --gpus entry runs test/profile (and the baseline) jobs; the job function
    is the worker double (tests/agent_doubles.py), since there is no GPU here."""
    env = _env(tmp_path, CAKE_EVAL_JOB_FN="agent_doubles:fake_eval")
    p = subprocess.run([sys.executable, "-m", "agent.run", "--task", "softmax", "--gpus", "0,1", "--max-candidates", "5",
                        "--ray-address", ray_cluster, "--run-id", "ray2", "--plain"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "baseline torch.softmax: 1.0000 ms on FakeGPU" in p.stdout
    con = sqlite3.connect(tmp_path / "home" / "cake.db")
    ex = {r[0] for r in con.execute("select executor from evaluations where stage in ('test', 'profile')")}
    assert ex and all(e.startswith("ray:gpu:") for e in ex)
    assert json.loads(con.execute("select summary from runs where id='ray2'").fetchone()[0])["best"]["measured"]
