"""cakelib.dispatch: fitting, picking, JSON round trip and evaluation of per-shape dispatch tables."""
import json
import math
import random
import time

import pytest

from cakelib.dispatch import FORMAT, DispatchTable, Measurement, evaluate, fit, shape_features

VARIANTS = {"A": {"family": "a", "bq": 16}, "B": {"family": "b", "bq": 64}, "C": {"family": "c"}}


def _two_regimes():
    """A is best for Q <= 32, B for Q >= 64 (by 2x either way); C is always 3x off the best."""
    rows = []
    for q in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]:
        for m in [1000, 100000, 1000000]:
            shape = {"Q": q, "M": m, "k": 10}
            base = q * m * 1e-6
            a, b = (base, 2 * base) if q <= 32 else (2 * base, base)
            rows += [Measurement(shape, "A", a, True), Measurement(shape, "B", b, True),
                     Measurement(shape, "C", 3 * base, True)]
    return rows


def _leaf(**kw):
    return {"variant": kw.pop("variant"), "n": kw.pop("n", 1), "loss": kw.pop("loss", 0.0),
            "alternates": kw.pop("alternates", []), **kw}


# ------------------------------------------------------------------------------------ features

def test_shape_features():
    shape = {"Q": 16, "M": 1024, "k": 10}
    assert shape_features(shape, ["log2_Q", "M", "k", "log2_Q*M"]) == [4.0, 1024.0, 10.0, 14.0]
    with pytest.raises(KeyError, match="'N'"):
        shape_features(shape, ["log2_N"])
    with pytest.raises(KeyError, match="log2_Q\\*N"):
        shape_features(shape, ["log2_Q*N"])
    with pytest.raises(ValueError, match="log2"):
        shape_features({"Q": 0}, ["log2_Q"])


# ----------------------------------------------------------------------------------------- fit

def test_recovers_threshold_between_regimes():
    rows = _two_regimes()
    t = fit("knn", rows, ["log2_M", "log2_Q", "k"], VARIANTS, fallback="C", min_leaf=3)
    # One split on log2_Q, halfway between log2(32) = 5 and log2(64) = 6; no further splits needed.
    assert t.tree["feature"] == "log2_Q"
    assert t.tree["threshold"] == pytest.approx(5.5)
    assert t.tree["le"]["variant"] == "A" and t.tree["gt"]["variant"] == "B"
    assert t.tree["le"]["n"] == 18 and t.tree["gt"]["n"] == 15
    assert t.tree["le"]["loss"] == pytest.approx(0.0)
    assert t.tree["le"]["alternates"] == ["B", "C"]           # ranked by leaf loss (2x before 3x)
    assert t.pick({"Q": 8, "M": 5, "k": 1}) == "A"
    assert t.pick({"Q": 2048, "M": 5, "k": 1}) == "B"
    ev = evaluate(t, rows)
    assert ev["shapes"] == 33 and ev["picked_failed"] == 0
    assert ev["geomean_slowdown_vs_oracle"] == pytest.approx(1.0)
    assert t.meta["fit"]["leaves"] == 2 and t.meta["fit"]["geomean_slowdown_vs_oracle"] == pytest.approx(1.0)


def test_max_depth_zero_is_one_leaf_minimising_geomean():
    rows = _two_regimes()
    t = fit("knn", rows, ["log2_Q"], VARIANTS, fallback="C", max_depth=0)
    # 18 shapes favour A, 15 favour B: A's total log slowdown (15 ln 2) < B's (18 ln 2).
    assert t.tree == {"variant": "A", "n": 33, "loss": pytest.approx(15 * math.log(2) / 33),
                      "alternates": ["B", "C"]}


def test_tail_weight_keeps_a_leaf_off_one_large_loss():
    """A: best on 12 shapes, 1.6x slower on a 13th; B: 4.5% slower on the 12, best on the 13th. The plain
    geomean picks A (ln 1.6 = 0.47 < 12 ln 1.045 = 0.53); with the tail term (slowdowns past 5% weigh
    4x) A costs 0.47 + 3 (0.47 - ln 1.05) = 1.73 and B, below the knee, stays at 0.53."""
    rows = []
    for q in range(13):
        a, b = (1.6, 1.0) if q == 12 else (1.0, 1.045)
        rows += [Measurement({"Q": 2 ** q}, "A", a, True), Measurement({"Q": 2 ** q}, "B", b, True)]
    v = {"A": {}, "B": {}}
    assert fit("knn", rows, ["log2_Q"], v, fallback="A", max_depth=0).tree["variant"] == "A"
    t = fit("knn", rows, ["log2_Q"], v, fallback="A", max_depth=0, tail=3.0)
    assert t.tree["variant"] == "B" and t.meta["fit"]["tail"] == 3.0
    assert t.tree["loss"] == pytest.approx(12 * math.log(1.045) / 13)


@pytest.mark.parametrize("min_leaf", [1, 3])
def test_failed_or_missing_variant_never_picked_where_it_failed(min_leaf):
    # A is 2x faster than B everywhere, but fails its check at Q=8 and was never run at Q=32.
    rows = []
    for q in [1, 2, 4, 8, 16, 32, 64]:
        shape = {"Q": q}
        if q == 8:
            rows.append(Measurement(shape, "A", 1.0, False))
        elif q != 32:
            rows.append(Measurement(shape, "A", 1.0, True))
        rows.append(Measurement(shape, "B", 2.0, True))
    t = fit("knn", rows, ["log2_Q"], {"A": {}, "B": {}}, fallback="B", min_leaf=min_leaf)
    assert t.pick({"Q": 8}) == "B" and t.pick({"Q": 32}) == "B"
    assert t.pick({"Q": 1}) == "A"
    ev = evaluate(t, rows)
    assert ev["picked_failed"] == 0
    if min_leaf == 1:   # free to isolate each failing shape: every other shape keeps A
        # Only Q=8 costs 2x (at Q=32 B is the only measured variant, hence the oracle).
        assert ev["geomean_slowdown_vs_oracle"] == pytest.approx(2 ** (1 / 7))


def test_failure_in_duplicate_measurement_disqualifies():
    rows = [Measurement({"Q": 1}, "A", 1.0, True), Measurement({"Q": 1}, "A", 1.0, False),
            Measurement({"Q": 1}, "B", 5.0, True)]
    t = fit("knn", rows, ["Q"], {"A": {}, "B": {}}, fallback="A")
    assert t.pick({"Q": 1}) == "B"


def test_unsafe_leaf_when_no_variant_runs_everywhere():
    # A fails at Q=1, B fails at Q=2, both run at Q=4. min_leaf=2 forbids isolating either failure.
    rows = [Measurement({"Q": 1}, "A", None, False), Measurement({"Q": 1}, "B", 1.0, True),
            Measurement({"Q": 2}, "A", 1.0, True), Measurement({"Q": 2}, "B", None, False),
            Measurement({"Q": 4}, "A", 1.0, True), Measurement({"Q": 4}, "B", 3.0, True),
            Measurement({"Q": 8}, "C", None, False)]          # nothing ran: not a shape
    v = {"A": {}, "B": {}, "C": {}}
    t = fit("knn", rows, ["Q"], v, fallback="B", min_leaf=2)
    assert t.tree == {"variant": "A", "n": 3, "loss": 0.0, "alternates": [], "unsafe": True, "failed": 1}
    assert evaluate(t, rows)["picked_failed"] == 1 and evaluate(t, rows)["shapes"] == 3
    # With min_leaf=1 the tree splits the failures away and every leaf is safe.
    t1 = fit("knn", rows, ["Q"], v, fallback="B", min_leaf=1)
    assert [t1.pick({"Q": q}) for q in (1, 2, 4)] == ["B", "A", "A"]
    assert evaluate(t1, rows)["picked_failed"] == 0
    assert t1.meta["fit"]["unsafe_leaves"] == 0


def test_fit_rejects_unknown_variant_and_empty_data():
    with pytest.raises(ValueError, match="'Z'"):
        fit("knn", [Measurement({"Q": 1}, "Z", 1.0, True)], ["Q"], {"A": {}}, fallback="A")
    with pytest.raises(ValueError, match="fallback"):
        fit("knn", [Measurement({"Q": 1}, "A", 1.0, True)], ["Q"], {"A": {}}, fallback="Z")
    with pytest.raises(ValueError, match="no shape"):
        fit("knn", [Measurement({"Q": 1}, "A", None, False)], ["Q"], {"A": {}}, fallback="A")


def test_deterministic():
    rows = _two_regimes()
    # Exact ties everywhere: B and D time identically, so the name decides (B < D).
    rows += [Measurement(r.shape, "D", r.ms, True) for r in rows if r.variant == "B"]
    v = {**VARIANTS, "D": {}}
    a = fit("knn", rows, ["log2_Q", "log2_M"], v, fallback="C", meta={"gpu": "H200"}).to_json()
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)
    b = fit("knn", shuffled, ["log2_Q", "log2_M"], v, fallback="C", meta={"gpu": "H200"}).to_json()
    assert a == b
    assert json.loads(a)["tree"]["gt"]["variant"] == "B"


def test_fast_on_realistic_size():
    rng = random.Random(1)
    names = [f"v{i:02d}" for i in range(20)]
    rows = []
    for q in [2 ** i for i in range(10)]:
        for m in [2 ** i for i in range(10, 25, 1)]:
            for v in names:
                ok = rng.random() > 0.05
                rows.append(Measurement({"Q": q, "M": m}, v, rng.uniform(1, 10) if ok else None, ok))
    assert len(rows) == 3000
    t0 = time.perf_counter()
    t = fit("knn", rows, ["log2_Q", "log2_M", "log2_Q*M"], {v: {} for v in names}, fallback="v00",
            max_depth=4, min_leaf=3)
    assert time.perf_counter() - t0 < 2.0
    assert 1 < len(_walk(t.tree)) <= 2 ** 4 and all(lf["n"] >= 3 for lf in _walk(t.tree))
    # Every safe leaf's variant ran on each of its shapes: picks fail only inside unsafe leaves.
    unsafe_failed = sum(lf.get("failed", 0) for lf in _walk(t.tree))
    assert evaluate(t, rows)["picked_failed"] == unsafe_failed


def _walk(node):
    return [node] if "variant" in node else _walk(node["le"]) + _walk(node["gt"])


# ---------------------------------------------------------------------------------------- pick

def test_supports_falls_to_alternates_then_fallback():
    v = {n: {} for n in "ABCDF"}
    t = DispatchTable("knn", 1, ["log2_Q"], v, "F",
                      {"feature": "log2_Q", "threshold": 3.0,
                       "le": _leaf(variant="A", alternates=["B", "C"]), "gt": _leaf(variant="D")})
    shape = {"Q": 4}
    assert t.pick(shape) == "A"
    assert t.pick(shape, supports=lambda n, s: True) == "A"
    assert t.pick(shape, supports=lambda n, s: n != "A") == "B"
    assert t.pick(shape, supports=lambda n, s: n not in ("A", "B")) == "C"
    assert t.pick(shape, supports=lambda n, s: n == "F") == "F"
    assert t.pick(shape, supports=lambda n, s: False) == "F"        # fallback is the last resort
    assert t.pick({"Q": 8}) == "A"                                   # log2(8) = 3 <= threshold
    assert t.pick({"Q": 16}) == "D" and t.pick({"Q": 16}, supports=lambda n, s: n != "D") == "F"
    # supports sees the shape: reject A only for odd k.
    assert t.pick({"Q": 4, "k": 3}, supports=lambda n, s: not (n == "A" and s["k"] % 2)) == "B"
    assert t.pick({"Q": 4, "k": 4}, supports=lambda n, s: not (n == "A" and s["k"] % 2)) == "A"


def test_threshold_boundary_goes_le():
    v = {"A": {}, "B": {}}
    t = DispatchTable("knn", 1, ["Q"], v, "A", {"feature": "Q", "threshold": 4.0,
                                                 "le": _leaf(variant="A"), "gt": _leaf(variant="B")})
    assert [t.pick({"Q": q}) for q in (4, 5)] == ["A", "B"]


# ---------------------------------------------------------------------------------------- JSON

def test_json_round_trip(tmp_path):
    t = fit("knn", _two_regimes(), ["log2_Q", "log2_M"], VARIANTS, fallback="C", version=3,
            meta={"gpu": "H200", "command": "python -m bench.knn"})
    text = t.to_json()
    data = json.loads(text)
    assert data["format"] == FORMAT and data["version"] == 3 and data["meta"]["gpu"] == "H200"
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"          # stable, sorted layout
    assert DispatchTable.from_json(text) == t
    assert DispatchTable.from_json(text).to_json() == text
    p = tmp_path / "knn.json"
    t.save(p)
    assert DispatchTable.load(p) == t


def test_from_json_rejects_bad_tables():
    good = json.loads(fit("knn", _two_regimes(), ["log2_Q"], VARIANTS, fallback="C").to_json())

    def bad(mutate, match):
        d = json.loads(json.dumps(good))
        mutate(d)
        with pytest.raises(ValueError, match=match):
            DispatchTable.from_json(json.dumps(d))

    bad(lambda d: d.update(format="cake-dispatch/2"), "format")
    bad(lambda d: d.pop("format"), "format")
    bad(lambda d: d["tree"]["gt"].update(variant="nope"), r"tree\.gt.*'nope'")
    bad(lambda d: d["tree"]["le"].update(alternates=["B", "ghost"]), r"tree\.le.*'ghost'")
    bad(lambda d: d.update(fallback="nope"), "fallback 'nope'")
    bad(lambda d: d["tree"].update(feature="log2_Z"), r"node tree:.*'log2_Z'")
    bad(lambda d: d["tree"].pop("gt"), r"node tree:.*'gt'")
    with pytest.raises(ValueError, match="format"):
        DispatchTable.from_json("[1, 2]")


# ------------------------------------------------------------------------------------ evaluate

def test_evaluate_hand_computed():
    t = DispatchTable("knn", 1, ["Q"], {"A": {}, "B": {}}, "B", _leaf(variant="A"))
    rows = [
        Measurement({"Q": 1}, "A", 2.0, True), Measurement({"Q": 1}, "B", 1.0, True),     # A: 2x slower
        Measurement({"Q": 2}, "A", 1.0, True), Measurement({"Q": 2}, "B", 4.0, True),     # A: oracle
        Measurement({"Q": 3}, "A", 8.0, True), Measurement({"Q": 3}, "B", 1.0, True),     # A: 8x slower
        Measurement({"Q": 4}, "A", None, False), Measurement({"Q": 4}, "B", 3.0, True),   # A failed
        Measurement({"Q": 5}, "B", 3.0, True),                                            # A not run
        Measurement({"Q": 6}, "A", None, False), Measurement({"Q": 6}, "B", None, False), # not a shape
    ]
    ev = evaluate(t, rows)
    assert ev == {"shapes": 5, "geomean_slowdown_vs_oracle": pytest.approx((2 * 1 * 8) ** (1 / 3)),
                  "worst_slowdown": pytest.approx(8.0), "worst_shape": {"Q": 3}, "picked_failed": 2}
    # With supports rejecting A at Q=3, the fallback B is picked there: slowdowns 2, 1, 1.
    ev2 = evaluate(t, rows, supports=lambda n, s: not (n == "A" and s["Q"] == 3))
    assert ev2["geomean_slowdown_vs_oracle"] == pytest.approx(2 ** (1 / 3))
    assert ev2["worst_shape"] == {"Q": 1}


# ------------------------------------------------------------------------------ cross-validation

def test_cross_validation_scores_unseen_shapes():
    """Leave-one-shape-out: the two-regime data generalises (every held-out shape still lands in its
    regime); on pure noise a tree of single-shape leaves is perfect on its training set but not on the
    held-out shapes."""
    from cakelib.dispatch import cross_validate
    rows = _two_regimes()
    cv = cross_validate("knn", rows, ["log2_M", "log2_Q", "k"], VARIANTS, fallback="C", min_leaf=3)
    assert cv["shapes"] == 33 and cv["picked_failed"] == 0
    assert cv["geomean_slowdown_vs_oracle"] == pytest.approx(1.0)
    rng = random.Random(7)
    noise = [Measurement({"Q": q, "M": 1000, "k": 10}, v, rng.uniform(1.0, 2.0), True)
             for q in range(1, 40) for v in ("A", "B")]
    kw = dict(max_depth=8, min_leaf=1)
    memo = fit("knn", noise, ["Q"], VARIANTS, fallback="C", **kw)
    train = evaluate(memo, noise)["geomean_slowdown_vs_oracle"]
    held = cross_validate("knn", noise, ["Q"], VARIANTS, fallback="C", **kw)["geomean_slowdown_vs_oracle"]
    assert train < 1.06 and held > train + 0.08, (train, held)


def test_fit_by_cross_validation_chooses_the_tree_size_the_data_needs():
    """Four regimes along Q (6 shapes each; a neighbour regime's variant is 1.2x slower, the other half's
    3x) need depth 2: a depth-1 tree leaves half the shapes 1.2x slower, on the training set and held
    out alike; the held-out estimate picks depth 2 and records every size tried. On two regimes both
    sizes are exact and the simpler one is kept."""
    from cakelib.dispatch import fit_by_cross_validation
    names = ["R0", "R1", "R2", "R3"]
    cost = lambda q, j: 1.0 if j == q // 6 else 1.2 if j // 2 == q // 12 else 3.0  # noqa: E731
    rows = [Measurement({"Q": q}, n, cost(q, j), True) for q in range(24) for j, n in enumerate(names)]
    sizes = ({"max_depth": 1, "min_leaf": 2}, {"max_depth": 2, "min_leaf": 2}, {"max_depth": 4, "min_leaf": 2})
    t = fit_by_cross_validation("knn", rows, ["Q"], {n: {} for n in names}, fallback="R0", sizes=sizes)
    chosen = t.meta["fit"]["chosen_by"]
    assert [{k: s[k] for k in ("max_depth", "min_leaf")} for s in chosen["tried"]] == list(sizes)
    # held out, a regime's edge shape can land with its neighbour (1.2x): depth 2 scores 1.06, depth 1 1.25
    assert chosen["tried"][1]["cv_geomean_slowdown"] < chosen["tried"][0]["cv_geomean_slowdown"] - 0.1
    assert t.meta["fit"]["max_depth"] == 2                     # depth 4 is no better: the simpler size wins
    assert chosen["leave_one_shape_out"]["geomean_slowdown_vs_oracle"] == chosen["tried"][1]["cv_geomean_slowdown"]
    assert all(t.pick({"Q": q}) == names[q // 6] for q in range(24))
    simple = fit_by_cross_validation("knn", _two_regimes(), ["log2_M", "log2_Q", "k"], VARIANTS, fallback="C", sizes=sizes)
    assert simple.meta["fit"]["max_depth"] == 1


# ---------------------------------------------------------------------------------------- pins

def _pinned_rows():
    """_two_regimes, with a new variant D timed only at Q = 64, M = 100000 (3x faster there than B)."""
    shape = {"Q": 64, "M": 100000, "k": 10}
    return _two_regimes() + [Measurement(shape, "D", 64 * 0.1 / 3, True)]


def test_pin_takes_a_variant_measured_at_one_shape_only():
    """A variant timed at one shape cannot win a leaf holding others (missing counts as failed); a pin
    runs it there, and only there."""
    from cakelib.dispatch import pin
    rows = _pinned_rows()
    v = {**VARIANTS, "D": {}}
    t = fit("knn", rows, ["log2_Q", "log2_M"], v, fallback="C")
    assert t.pick({"Q": 64, "M": 100000, "k": 10}) == "B"          # the tree alone
    p = pin(t, rows, slower_than=1.05)
    assert p.pins == [{"shape": {"M": 100000, "Q": 64, "k": 10}, "variant": "D", "slowdown": pytest.approx(3.0)}]
    assert p.pick({"Q": 64, "M": 100000, "k": 10}) == "D"
    assert p.pick({"Q": 64, "M": 100000, "k": 10, "D": 128}) == "D"   # keys the pins do not name are ignored
    assert p.pick({"Q": 64, "M": 1000, "k": 10}) == "B" and p.pick({"Q": 64, "M": 100000, "k": 16}) == "B"
    assert p.pick({"Q": 64, "M": 100000, "k": 10}, supports=lambda n, s: n != "D") == "B"   # a refused pin
    assert "D" in p.reachable() and "D" not in t.reachable()
    assert p.tree == t.tree and p.meta["pins"]["pinned"] == 1
    assert p.meta["pins"]["pins_vs_oracle"]["geomean_slowdown_vs_oracle"] == pytest.approx(1.0)
    assert p.meta["pins"]["tree_vs_oracle"]["worst_slowdown"] == pytest.approx(3.0)
    again = pin(p, rows, slower_than=1.05)                          # re-pinning: the tree's numbers stay the tree's
    assert again.pins == p.pins and again.meta["pins"]["tree_vs_oracle"]["worst_slowdown"] == pytest.approx(3.0)
    assert evaluate(p, rows)["worst_slowdown"] == pytest.approx(1.0)
    assert DispatchTable.from_json(p.to_json()) == p and DispatchTable.from_json(p.to_json()).pick(
        {"Q": 64, "M": 100000, "k": 10}) == "D"


def test_pin_threshold_and_unmeasured_picks():
    """Within the threshold no pin; a shape whose tree pick has no row (another run timed it) gets none;
    a pick that failed its check is pinned away from."""
    from cakelib.dispatch import pin
    shape = {"Q": 64, "M": 100000, "k": 10}
    v = {**VARIANTS, "D": {}}
    t = fit("knn", _two_regimes(), ["log2_Q", "log2_M"], v, fallback="C")          # B at Q = 64
    near = [Measurement(shape, "B", 1.0, True), Measurement(shape, "D", 0.96, True)]
    assert pin(t, near, slower_than=1.05).pins == []
    assert pin(t, near, slower_than=1.03).pins[0]["variant"] == "D"
    assert pin(t, [Measurement(shape, "D", 0.1, True), Measurement(shape, "A", 0.2, True)]).pins == []
    failed = pin(t, [Measurement(shape, "B", 0.1, False), Measurement(shape, "A", 0.5, True)])
    assert failed.pins == [{"shape": shape, "variant": "A", "slowdown": None}]
    assert json.loads(failed.to_json())["pins"][0]["slowdown"] is None


def test_pins_are_checked_on_load():
    from cakelib.dispatch import pin
    good = json.loads(pin(fit("knn", _pinned_rows(), ["log2_Q"], {**VARIANTS, "D": {}}, fallback="C"),
                          _pinned_rows()).to_json())
    assert good["pins"]

    def bad(mutate, match):
        d = json.loads(json.dumps(good))
        mutate(d)
        with pytest.raises(ValueError, match=match):
            DispatchTable.from_json(json.dumps(d))

    bad(lambda d: d["pins"][0].update(variant="ghost"), r"pins\[0\].*'ghost'")
    bad(lambda d: d["pins"].append(dict(d["pins"][0])), r"pins\[1\].*pinned twice")
    bad(lambda d: d["pins"].append({"shape": {"Q": 1}, "variant": "A"}), r"pins\[1\].*differ")
    bad(lambda d: d["pins"].append({"variant": "A"}), r"pins\[1\]: expected")
    no_pins = json.loads(fit("knn", _two_regimes(), ["log2_Q"], VARIANTS, fallback="C").to_json())
    assert "pins" not in no_pins                     # a table without pins keeps its committed layout
