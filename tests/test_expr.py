import pytest

from cake_ir import expr as E


def test_parse_and_evaluate_floor_semantics():
    n = E.parse_index("(kt + 3) % 4 * 16 + K / 64")
    assert E.evaluate(n, {"kt": 5, "K": 256}) == 0 * 16 + 4


@pytest.mark.parametrize("bad,msg", [("a +", "unexpected"), ("foo(1)", "unknown function"), ("1.5 + a", "integer"),
                                     ("a < b", "comparison"), ("a $ b", "unexpected character"), ("min(1)", "argument")])
def test_index_errors_are_clear(bad, msg):
    with pytest.raises(E.ExprError, match=msg):
        E.parse_index(bad)


def test_facts_prove_divisibility_and_range():
    env = {"bid.y": E.Fact(0, 63, 1), "kt": E.Fact(0, 127, 1), "K": E.Fact(64, 8192, 64)}
    f = E.facts(E.parse_index("bid.y * 128 + kt * 64"), env)
    assert f.divisible_by(64) and f.lo == 0 and f.hi == 63 * 128 + 127 * 64
    assert not E.facts(E.parse_index("bid.y * 128 + 8"), env).divisible_by(16)
    assert E.facts(E.parse_index("K / 64"), env).lo == 1
    m = E.facts(E.parse_index("kt % 4"), env)
    assert (m.lo, m.hi) == (0, 3)


def test_canonical_equality_is_symbolic():
    assert E.same("(kt + 3) % 4", "(3 + kt) % 4")
    assert E.same("2 * (a + b)", "b * 2 + a + a")
    assert not E.same("kt % 4", "(kt + 1) % 4")


def test_canonical_form_folds_constant_division():
    assert E.same("(0) % 1", "0") and E.same("(g + 1) % 1", "0") and E.same("g / 1", "g")
    assert E.same("7 / 2", "3") and E.same("-7 / 2", "-3") and E.same("-7 % 2", "-1")   # C's truncation
    assert not E.same("g % 2", "0") and not E.same("g / 2", "g")


def test_cond_and_value_contexts():
    assert E.free_vars(E.parse_cond("role_warp == 0 && elect_one()")) == {"role_warp"}
    v = E.parse_value("exp2((x - m) * 1.4426950408889634)")
    assert E.free_vars(v) == {"x", "m"}
    c = E.to_c(v, lambda var: var.name + "[e]", float_mode=True)
    assert "exp2f" in c and "x[e]" in c


def test_deep_nesting_is_rejected_not_crashing():
    with pytest.raises(E.ExprError):
        E.parse_index("(" * 500 + "1" + ")" * 500)
