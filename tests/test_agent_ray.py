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


@pytest.fixture
def ray_cluster():
    import shutil
    import tempfile
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")        # loopback only; no token file in $HOME
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")           # AF_UNIX socket paths are short
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), old]))   # for the actors' imports
    ctx = ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False,
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


def test_dry_run_campaign_through_ray_actors(tmp_path, ray_cluster):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAKE_")}
    env.update(CAKE_HOME=str(tmp_path / "home"), CAKE_LIBRARY_DIR=str(tmp_path / "lib"),
               CAKE_CACHE_DIR=str(tmp_path / "cubin"), RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
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
