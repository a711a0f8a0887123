"""The explore strategy: deterministic per seed, and it really leaves the families' declared spaces."""
import random

from agent.explore import widened


def _propose(task: str, seed: int, n: int = 8):
    from agent.candidates import ProposeContext
    from agent.explore import ExploreStrategy
    from agent.strategies import member_of, new_strategy_state
    from cake_ir import arch
    from tasks.registry import get
    entry = get(task)
    st = new_strategy_state("explore", "search")
    for g in entry.seed_genomes():
        st["pop"].append(member_of({"hash": g["name"], "name": g["name"], "score_s": 1e-3, "ir": g["ir"],
                                    "recipe": g["recipe"]}))
    ctx = ProposeContext(rng=random.Random(seed), seen=set(), notes=[], iteration=1, entry=entry,
                         spec=arch.spec("sm_90a"), shape=entry.bench_shape, dry_run=True)
    return ExploreStrategy().propose(st, n, ctx)[0]


def test_widened_adds_halves_and_doubles():
    assert widened([64, 128]) == [32, 64, 128, 256]
    assert widened([1]) == [1, 2]            # no zero
    assert widened(["a", 2]) == [1, 2, 4, "a"]


def test_explore_is_deterministic_and_distinct():
    a, b = _propose("softmax", 3), _propose("softmax", 3)
    assert [c["hash"] for c in a] == [c["hash"] for c in b]
    assert len(a) >= 4 and len({c["hash"] for c in a}) == len(a)
    assert all(c["strategy"] == "explore" and c["params"] for c in a)


def test_explore_leaves_the_declared_space():
    # over a few seeds some candidate must use a parameter value outside the family's declared space
    from tactics.family import family
    outside = 0
    for seed in range(4):
        for c in _propose("gemm", seed):
            fam = family(c.get("recipe"))
            if fam is None:
                continue
            for name, v in (c.get("params") or {}).items():
                if name in fam["space"] and v not in fam["space"][name]:
                    outside += 1
    assert outside > 0
