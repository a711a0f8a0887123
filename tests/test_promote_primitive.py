"""IR-primitive promotion: recurring subtrees of successful candidates (real seeds + real tactic children
in a temporary knowledge DB) become primitives/<name>.py with a test that passes once merged."""
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from cake_ir.builder import KernelBuilder, tile
from cake_ir.io import ir_hash, load
from cake_ir.verifier import verify
from knowledge.promote import primitive as P
from knowledge.promote.base import PromoteConfig
from knowledge.store import Store

ROOT = Path(__file__).resolve().parents[1]
COPY = ("cake_ir", "rules", "tactics", "tasks", "primitives", "calibration")


# ------------------------------------------------------------------------------ helpers
def seed(task, name):
    from tasks import registry
    return next(g for g in registry.get(task).seed_genomes() if g["name"] == name)


def child(g, tactic, params):
    from tactics.base import get_tactic
    return get_tactic(tactic).apply(g, params)


def add(store, run, task, g, status="ok", parent=None, tactic=None, params=None):
    k, diags = load(g["ir"])
    assert k is not None, diags
    h = ir_hash(k)
    store.create_run(run, task)
    store.upsert_candidate(run, {"hash": h, "name": k.name, "ir": g["ir"], "recipe": g.get("recipe"),
                                 "parent": parent, "tactic": tactic, "params": params, "status": status,
                                 "stage": "compile"})
    return h


def materialise(files: dict, dest: Path) -> Path:
    """A checkout of the repo parts the generated tests need, with the proposal's files merged in."""
    for d in COPY:
        shutil.copytree(ROOT / d, dest / d, ignore=shutil.ignore_patterns("__pycache__", "library"))
    (dest / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", dest / "tests" / "conftest.py")
    for rel, text in files.items():
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return dest


def run_generated_tests(files: dict, dest: Path) -> subprocess.CompletedProcess:
    materialise(files, dest)
    tests = [rel for rel in files if rel.startswith("tests/") and rel.endswith(".py")]
    # no third-party pytest plugins: their autoload costs seconds per run and the generated tests need none
    env = dict(os.environ, PYTHONPATH=str(dest), PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=dest,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def store(tmp_path):
    s = Store(url=f"sqlite:///{tmp_path / 'k.db'}")
    yield s
    s.close()


@pytest.fixture
def gemm_population(store):
    """The wgmma seed and three real tactic children, over two runs; one failed candidate."""
    g = seed("gemm", "gemm_wgmma_sm90a")
    h0 = add(store, "r1", "gemm", g)
    add(store, "r1", "gemm", child(g, "stages", {"S": 3}), parent=h0, tactic="stages", params={"S": 3})
    add(store, "r1", "gemm", child(g, "unroll", {"loop": "mma_loop", "unroll": 2}), parent=h0, tactic="unroll")
    add(store, "r2", "gemm", g)
    add(store, "r2", "gemm", child(g, "retile", {"bn": 128, "bk": 64}), parent=h0, tactic="retile")
    add(store, "r2", "gemm", child(g, "warp_split", {"consumers": 4, "bm": 256}), status="failed")
    return store


# ------------------------------------------------------------------------------ mining
def test_proposes_primitives_with_parameters_from_recurring_subtrees(gemm_population):
    props = P.propose(gemm_population, PromoteConfig(min_candidates=2))
    assert props and len(props) <= P.MAX_PROPOSALS
    by_name = {p.evidence["name"]: p for p in props}
    # The consumer's pipeline body (wait, fence, wgmma, commit, wait, release) recurs in all four
    # successful programs; retile changed the B tile's rows, which became a parameter.
    body = by_name["pipe_wait_wgmma_pipe_release"]
    ev = body.evidence
    assert ev["support"]["candidates"] == 4 and ev["support"]["tasks"] == ["gemm"]
    assert sorted(ev["support"]["runs"]) == ["r1", "r2"]
    assert ev["statements"] == 6 and ev["ops"][0] == "pipe_wait" and "wgmma" in ev["ops"]
    assert ev["params"]["wgmma_b_shape_0"] == "int" and ev["params"]["wgmma_id"] == "str"
    assert {e["params"]["wgmma_b_shape_0"] for e in ev["examples"]} == {256, 128}
    assert set(body.files) == {"primitives/pipe_wait_wgmma_pipe_release.py",
                               "tests/fixtures/primitives/pipe_wait_wgmma_pipe_release.json",
                               "tests/test_primitive_pipe_wait_wgmma_pipe_release.py"}
    assert body.kind == "primitive" and body.id.startswith("primitive-")
    json.dumps(ev)                                   # evidence is JSON-able
    # The failed candidate is not evidence: every occurrence comes from an ok one.
    assert len(ev["candidates"]) == 4


def test_generated_module_expands_every_observed_occurrence(gemm_population):
    props = P.propose(gemm_population, PromoteConfig(min_candidates=2))
    for prop in props:
        name = prop.evidence["name"]
        mod = types.ModuleType(name)
        exec(compile(prop.files[f"primitives/{name}.py"], name, "exec"), mod.__dict__)
        fx = json.loads(prop.files[f"tests/fixtures/primitives/{name}.json"])
        assert mod.NAME == name and mod.PARAMS == fx["params"]
        assert mod.EXAMPLES == [occ["params"] for occ in fx["occurrences"]]    # the observed parameters
        for occ in fx["occurrences"]:
            assert mod.expand(**occ["params"]) == occ["statements"]
        with pytest.raises(TypeError):
            mod.expand()                                 # parameters are required ...
        if mod.PARAMS:
            bad = dict(fx["occurrences"][0]["params"])
            k = next(iter(bad))
            bad[k] = [1]                                 # ... and type-checked
            with pytest.raises(TypeError):
                mod.expand(**bad)


def test_same_evidence_same_fingerprint(gemm_population):
    a = P.propose(gemm_population, PromoteConfig(min_candidates=2))
    b = P.propose(gemm_population, PromoteConfig(min_candidates=2))
    assert [p.fingerprint for p in a] == [p.fingerprint for p in b]


def test_generated_tests_pass_once_merged(gemm_population, tmp_path):
    props = P.propose(gemm_population, PromoteConfig(min_candidates=2))
    files = {}
    for p in props:
        files.update(p.files)
    res = run_generated_tests(files, tmp_path / "checkout")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{3 * len(props)} passed" in res.stdout


def test_generated_test_fails_on_a_wrong_template(gemm_population, tmp_path):
    prop = P.propose(gemm_population, PromoteConfig(min_candidates=2))[0]
    name = prop.evidence["name"]
    files = dict(prop.files)
    files[f"primitives/{name}.py"] = files[f"primitives/{name}.py"].replace('"pipe_wait"', '"pipe_acquire"', 1) \
        .replace('"tma_load"', '"cp_async"', 1).replace('"wgmma_commit"', '"wgmma_fence"', 1)
    assert files[f"primitives/{name}.py"] != prop.files[f"primitives/{name}.py"]
    res = run_generated_tests(files, tmp_path / "checkout")
    assert res.returncode != 0 and "failed" in res.stdout


def test_no_proposal_when_support_is_too_low(store):
    g = seed("gemm", "gemm_wgmma_sm90a")
    h0 = add(store, "r1", "gemm", g)
    add(store, "r1", "gemm", child(g, "stages", {"S": 3}), status="failed", parent=h0, tactic="stages")
    assert P.propose(store, PromoteConfig(min_candidates=2)) == []
    add(store, "r1", "gemm", child(g, "stages", {"S": 2}), parent=h0, tactic="stages")
    assert P.propose(store, PromoteConfig(min_candidates=2))
    assert P.propose(store, PromoteConfig(min_candidates=3)) == []
    assert P.propose(store, PromoteConfig(min_candidates=2, task="softmax")) == []


# ------------------------------------------------------------------------------ registry and builder
SCALE = types.ModuleType("ldg_scale_stg")
exec('''
from primitives import instantiate
NAME = "ldg_scale_stg"
PARAMS = {"src": "str", "dst": "str", "reg": "str", "factor": "float"}
TEMPLATE = [
    {"op": "ldg", "src": {"buf": {"$param": "src"}, "offset": ["bid.x", 0], "shape": [1, 512]}, "dst": {"buf": {"$param": "reg"}}},
    {"op": "map", "dst": {"buf": {"$param": "reg"}}, "expr": {"$param": "factor"}},
    {"op": "stg", "src": {"buf": {"$param": "reg"}}, "dst": {"buf": {"$param": "dst"}, "offset": ["bid.x", 0], "shape": [1, 512]}},
]
def expand(**params):
    out = instantiate(TEMPLATE, PARAMS, params)
    out[1]["expr"] = f"{params['reg']} * {params['factor']}"
    return out
''', SCALE.__dict__)


def test_emit_builds_a_kernel_that_verifies(monkeypatch):
    import primitives

    monkeypatch.setitem(primitives._CACHE, "primitives", {"ldg_scale_stg": SCALE})
    kb = KernelBuilder("scale", arch="sm_90a", grid=["M"], threads=128)
    kb.scalar("M", min=1)
    kb.tensor("X", "f32", ["M", 512])
    kb.tensor("Y", "f32", ["M", 512], access="write")
    kb.buffer("x", "reg", "f32", [1, 512], layout="blocked", vec=4, scope="cta")
    with kb.role("main", warps=(0, 4)) as r:
        sts = primitives.emit(r, "ldg_scale_stg", src="X", dst="Y", reg="x", factor=2.0)
    assert [s["op"] for s in sts] == ["ldg", "map", "stg"]
    res = verify(kb.build())
    assert res.ok, [d.code for d in res.diagnostics]
    with pytest.raises(KeyError):
        primitives.expand("no_such_primitive")
    assert primitives.cards()[0]["name"] == "ldg_scale_stg"


def test_registry_skips_helpers_and_subpackages(tmp_path, monkeypatch):
    import importlib

    import primitives

    pkg = tmp_path / "myprims"
    (pkg / "proposed").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_helper.py").write_text("raise RuntimeError('helpers are not imported')\n")
    (pkg / "proposed" / "__init__.py").write_text("raise RuntimeError('proposed/ is never imported')\n")
    (pkg / "two_maps.py").write_text(
        "from primitives import instantiate\nNAME = 'two_maps'\nPARAMS = {'b': 'str'}\n"
        "T = [{'op': 'map', 'dst': {'buf': {'$param': 'b'}}, 'expr': '1'}] * 2\n"
        "def expand(**p):\n    return instantiate(T, PARAMS, p)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    found = primitives.load_primitives("myprims")
    assert list(found) == ["two_maps"]
    assert found["two_maps"].expand(b="x") == [{"op": "map", "dst": {"buf": "x"}, "expr": "1"}] * 2
