"""Every rule code has a failing fixture (expected code at the expected node path) and a passing
fixture (no errors at all), both run here."""
import json
import pathlib

import pytest

from cake_ir.io import load
from cake_ir.verifier import load_rules, verify

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "rules" / "fixtures"
RULES = load_rules()
CODES = [r.code for r in RULES]


def _kernel(path):
    doc = json.loads(path.read_text())
    k, diags = load(doc["kernel"])
    assert k is not None, [d.short() for d in diags]
    return doc, k


def test_enough_rules_across_families():
    fams = {r.family for r in RULES}
    assert {"RES", "ARCH", "MMA", "CPY", "SYN", "PIP", "PERF"} <= fams, fams
    assert len(RULES) >= 25


@pytest.mark.parametrize("code", CODES)
def test_rule_has_fixtures(code):
    assert (FIXTURES / code / "fail.json").exists(), f"{code} has no failing fixture"
    assert (FIXTURES / code / "pass.json").exists(), f"{code} has no passing fixture"


@pytest.mark.parametrize("code", CODES)
def test_failing_fixture(code):
    path = FIXTURES / code / "fail.json"
    if not path.exists():
        pytest.skip("no fixture")
    doc, k = _kernel(path)
    exp = doc["expect"]
    assert exp["code"] == code
    res = verify(k)
    hits = [d for d in res.diagnostics if d.code == code]
    assert hits, f"{code} not reported; got {[d.short() for d in res.diagnostics]}"
    assert any(d.node == exp["node"] for d in hits), [d.short() for d in hits]
    assert not any(d.code == "E-VERIFY-INTERNAL" for d in res.diagnostics), [d.short() for d in res.diagnostics]


@pytest.mark.parametrize("code", CODES)
def test_passing_fixture(code):
    path = FIXTURES / code / "pass.json"
    if not path.exists():
        pytest.skip("no fixture")
    _, k = _kernel(path)
    res = verify(k)
    assert not [d for d in res.diagnostics if d.severity == "error" or d.code == code], \
        [d.short() for d in res.diagnostics]


@pytest.mark.parametrize("pad,flagged", [(0, True), (4, True), (8, False)])
def test_w_perf_01_models_f32_accumulator_pairs_per_half_warp(pad, flagged):
    """An f32 accumulator's lds / sts move 8-byte pairs, a half-warp (4 rows x 32 bytes) per wavefront:
    a 132-float pitch (pad 4) still puts rows g and g + 1 in overlapping banks, a 136-float one does
    not. The rule used to model one 8-byte run per row over 8 rows: it flagged pad 8 and proposed pad 4."""
    from cake_ir.builder import KernelBuilder, tile
    kb = KernelBuilder("acc_pairs", arch="sm_80", grid=[1], threads=32)
    kb.tensor("O", "f32", [16, 64], access="write")
    kb.buffer("s", "smem", "f32", [16, 64], **({"pad": pad} if pad else {}))
    kb.buffer("acc", "reg", "f32", [16, 64], layout="mma_acc", scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        r.fill("acc", 1.0)
        r.sts(tile("acc"), tile("s"), vec_bytes=8)
        r.sync("syncwarp")
        r.lds(tile("s"), tile("acc"), vec_bytes=8)
        r.stg(tile("acc"), tile("O"), vec_bytes=8)
    hits = [d for d in verify(kb.build()).diagnostics if d.code == "W-PERF-01"]
    assert bool(hits) == flagged, [d.short() for d in hits]
    if flagged:
        assert hits[0].fix == [{"op": "replace", "path": "/buffers/0/pad", "value": 8}], hits[0].fix
