"""Fuzz the IR front end (CI-sized; bench/fuzz_ir.py runs the same core at volume).

Every document — a seed program with fields perturbed, names pointed at the wrong kind of object,
truncated JSON text, wrong types, deep nesting, very long expressions — goes through
load -> verify -> format_kernel -> cost.estimate -> lower (emit CUDA, no NVRTC). Diagnostics are fine;
an unhandled exception anywhere fails. Hypothesis runs derandomized with bounded examples, so CI is
reproducible; tests/_fuzz.py holds the mutators.
"""
import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _fuzz import check, cross_reference, deep_nesting, mutate, seed_documents

SEEDS = [doc for _, doc in seed_documents()]
CI = settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _ok(doc):
    outcome, where = check(doc)
    assert outcome != "crash", f"{where}\n{(doc if isinstance(doc, str) else json.dumps(doc))[:3000]}"
    return outcome


def test_every_seed_is_clean_or_diagnosed():
    assert len(SEEDS) >= 40
    assert all(_ok(d) in ("clean", "diagnostics") for d in SEEDS)


@CI
@given(st.sampled_from(range(len(SEEDS))), st.integers(0, 2**32 - 1), st.integers(1, 3))
def test_mutated_seeds(i, seed, n):
    _ok(mutate(SEEDS[i], random.Random(seed), n))


@settings(CI, max_examples=60)
@given(st.sampled_from(range(len(SEEDS))), st.integers(0, 2**32 - 1))
def test_wrong_names_and_cycles(i, seed):
    _ok(cross_reference(SEEDS[i], random.Random(seed)))


@settings(CI, max_examples=40)
@given(st.sampled_from(range(len(SEEDS))), st.floats(0, 1))
def test_truncated_json_text(i, frac):
    text = json.dumps(SEEDS[i])
    assert _ok(text[: int(len(text) * frac)]) == "rejected" or frac > 0.99


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                    max_leaves=30)


@settings(CI, max_examples=60)
@given(st.sampled_from(range(len(SEEDS))), st.sampled_from(["name", "launch", "consts", "params", "buffers",
                                                            "barriers", "pipelines", "prologue", "roles"]), JSON)
def test_wrong_types_at_top_level_fields(i, key, value):
    _ok({**SEEDS[i], key: value})


def test_structural_extremes():
    for depth in (1, 30, 63, 64, 65, 500):
        _ok(deep_nesting(depth))
    _ok("[" * 100_000 + "]" * 100_000)
    _ok("{" * 5000)
    _ok(b"\xff\xfe\x00garbage")
    _ok("")
    _ok([])
    big = json.loads(json.dumps(SEEDS[0]))
    big["launch"]["grid"] = ["+".join(["M"] * 1999)]
    _ok(big)
    big["launch"]["grid"] = ["(" * 2000 + "M" + ")" * 2000]
    _ok(big)
    for doc in SEEDS[:8]:
        for p in doc.get("pipelines", []):  # a pipeline naming itself / a barrier naming a buffer
            d = json.loads(json.dumps(doc))
            d["pipelines"][0].update(buffers=[p["name"]], consumers=[p["name"]], producer=p["name"])
            _ok(d)
        if doc.get("barriers") and doc.get("buffers"):
            d = json.loads(json.dumps(doc))
            d["barriers"][0]["name"], d["buffers"][0]["name"] = "same", "same"
            _ok(d)


def test_pipeline_sugar_that_cannot_expand_is_diagnosed():
    """Regressions: `<pipe>_empty` past the 48-character identifier limit, an `iter` too long to wrap,
    and a stage larger than an expect_tx count made expand_pipelines raise a pydantic ValidationError."""
    from cake_ir.io import load
    from cake_ir.verifier import verify
    doc = next(d for d in SEEDS if d.get("pipelines"))
    long_name = json.loads(json.dumps(doc))
    long_name["pipelines"][0]["name"] = "p" * 48
    text = json.dumps(long_name).replace(f'"pipe": "{doc["pipelines"][0]["name"]}"', f'"pipe": "{"p" * 48}"')
    long_iter = json.loads(json.dumps(doc).replace('"iter": "', '"iter": "' + "1 + " * 990 + " "))
    huge = json.loads(json.dumps(doc))
    huge["buffers"][0]["shape"] = [2**31 - 1, 2**31 - 1]
    for d in (json.loads(text), long_iter, huge):
        kernel, diags = load(d)
        if kernel is not None:
            res = verify(kernel)
            assert res.diagnostics and not any(x.code == "E-VERIFY-INTERNAL" for x in res.diagnostics)
        _ok(d)
