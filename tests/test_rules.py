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
