"""bench/replay.py: the per-campaign numbers it reports, computed from a real knowledge DB."""
import importlib.util
import pathlib

from knowledge.store import Store

from _knowledge_data import populate

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _replay():
    spec = importlib.util.spec_from_file_location("replay", ROOT / "bench" / "replay.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_metrics_split_failures_by_the_stage_that_caught_them(tmp_path):
    store = Store(url=f"sqlite:///{tmp_path / 'cake.db'}")
    populate(store, "replay-1", n_fail=3, compile_s=1.5)
    store.close()
    m = _replay().metrics(tmp_path, "replay-1")
    assert m["candidates"] == 10 and m["failed"] == 5
    assert m["failed_by_stage"] == {"compile": 3, "verify": 2}
    assert (m["caught_at_verify"], m["escaped_verify"], m["share_caught_at_verify"]) == (2, 3, 0.4)
    assert m["failing_compile_s"] == 4.5 and m["failing_gpu_s"] == 0.0
    assert m["passing_seconds"]["compile"] == 5.0
    assert {"stage": "compile", "code": "E-LOWER-UNSUPPORTED", "candidates": 3} in m["failure_codes"]


def test_cli_defaults_are_a_reproducible_small_campaign():
    a = _replay().parser().parse_args(["--dry-run"])
    assert a.dry_run and a.seed == 0 and a.n == 40 and "explore" in a.proposer and a.task == "softmax"
