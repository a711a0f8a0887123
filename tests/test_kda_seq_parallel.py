"""The sequence-parallel KDA prefill (tasks/kda/seq_parallel.py): the two-pass Program with its
recurrence split into segments. On the CPU: the segment algebra it rests on holds for the float64 token
recurrence, the four kernels verify and compile for sm_80 and sm_90a, segment slots of packed sequences
never collide, the search reaches the axis. On a GPU (marked): the float64 check of the two-pass tests,
with 2-chunk segments (many segments, partial last ones, one-segment sequences) and the default 64."""
import random

import numpy as np
import pytest

from cake_ir import expr as E
from cake_ir.compiler import compile_program
from cake_ir.verifier import verify

from test_kda_two_pass import check_on_gpu


def _program(arch="sm_90a", **kw):
    from tasks.kda.two_pass import kda_two_pass
    return kda_two_pass(arch=arch, **{"segments": 64, **kw})


def test_segment_of_the_recurrence_is_affine_in_its_start_state():
    """What the ends kernel computes: from S = I with v = 0 a segment's transition M, from S = 0 with v
    its end state B; then S_end = M S_start + B and, chained, the final state of the whole sequence."""
    from tasks.kda.reference import recurrent_sequence
    rng = np.random.default_rng(0)
    T, HV, K, V, seg = 96, 2, 8, 8, 32
    k = rng.standard_normal((T, HV, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    q, v = rng.standard_normal((T, HV, K)), rng.standard_normal((T, HV, V))
    g, beta = -rng.uniform(0, 2, (T, HV, K)), rng.uniform(0, 1, (T, HV))
    S0 = rng.standard_normal((HV, K, V))
    _, want = recurrent_sequence(q, k, v, g, beta, S0, 1.0)
    S = S0
    eye = np.broadcast_to(np.eye(K), (HV, K, K))
    for t0 in range(0, T, seg):
        sl = slice(t0, t0 + seg)
        _, M = recurrent_sequence(q[sl], k[sl], np.zeros((seg, HV, K)), g[sl], beta[sl], eye, 1.0)
        _, B = recurrent_sequence(q[sl], k[sl], v[sl], g[sl], beta[sl], np.zeros((HV, K, V)), 1.0)
        S = M @ S + B
    assert np.abs(S - want).max() < 1e-10 * np.abs(want).max()


@pytest.mark.parametrize("kw", [dict(safe=True), dict(safe=False), dict(safe=True, vs=64, segments=2),
                                dict(safe=False, vs=128, consumers=8, copy="bulk")],
                         ids=["safe", "softplus", "vs64-seg2", "vs128-bulk"])
def test_seq_parallel_verifies_and_compiles(kw):
    prog = _program(**kw)
    res = verify(prog)
    assert res.ok, [d.short() for d in res.diagnostics if d.severity == "error"]
    assert [k.name.split("_")[2] for k in prog.kernels[1:]] == ["ends", "starts", "outputs"]
    assert {w.name for w in prog.workspace} >= {"wsE", "wsS"}
    for arch in ("sm_90a",) if kw.get("copy") == "bulk" else ("sm_80", "sm_90a"):
        # the whole program, verified for `arch` (a kernel alone declares the program's output `o` that
        # the outputs kernel writes: E-OUT-01 outside the program), then every kernel compiled
        r = compile_program(prog, arch=arch)
        assert r.ok, (arch, [d.short() for d in r.diagnostics if d.severity == "error"])
        for k, kr in zip(prog.kernels[1:], r.kernels[1:]):   # the prepare kernel is two_pass's
            assert kr.resources["spill_store_bytes"] == 0, (k.name, arch)


def test_seq_parallel_rejects_points_it_does_not_build():
    with pytest.raises(ValueError, match="power of two"):
        _program(segments=48)
    with pytest.raises(ValueError, match="power of two"):
        _program(segments=512)
    with pytest.raises(ValueError, match="bulk loader with V-slices of 64 or 128"):
        _program(segments=64, copy="bulk", vs=32)


def _let(kernel, role: str, name: str):
    for st in kernel.role(role).body:
        if getattr(st, "op", None) == "let" and st.name == name:
            return E.parse_index(st.value)
    raise KeyError(name)


@pytest.mark.parametrize("segments", [2, 64])
def test_segment_slots_of_packed_sequences_never_collide_and_fit(segments):
    """gs(n) + j as the three segment kernels compute it: one slot per segment of every sequence (one for
    an empty sequence, whose start state is its h0), all inside the declared workspace."""
    prog = _program(segments=segments)
    ends, starts, outs = prog.kernels[1:]
    gs_ends, gs_outs = _let(ends, "cons", "gs"), _let(outs, "cons", "gs")
    gs0 = _let(starts, "comb", "gs0")
    slots = E.parse_index(prog.workspace_tensor("wsS").shape[0])
    rng = random.Random(5)
    for _ in range(200):
        lens = [rng.choice([0, 1, 15, 16, 17, 33, rng.randint(1, 40 * segments)]) for _ in range(rng.randint(1, 9))]
        cu = [0]
        for ln in lens:
            cu.append(cu[-1] + ln)
        T, N = max(cu[-1], 1), len(lens)
        used = set()
        for n, ln in enumerate(lens):
            nsg = -(-(-(-ln // 16)) // segments)
            for j in range(max(nsg, 1)):
                env = {"bos": cu[n], "n": n, "j": j}
                s = E.evaluate(gs_outs, env)
                assert s == E.evaluate(gs0, env) + j
                if j + 1 < nsg:
                    assert s == E.evaluate(gs_ends, env)
                assert s not in used
                used.add(s)
        assert max(used) < E.evaluate(slots, {"T": T, "N": N, "HV": 1}) // 128


def test_search_reaches_sequence_parallel_through_its_family_tactic():
    from tactics.family import TACTICS
    from tasks.kda.programs import FAMILIES
    t = next(x for x in TACTICS if x.name == "sequence_parallel")
    for fam in ("kda_two_pass_safe_sm90a", "kda_two_pass_softplus_sm90a"):
        g = {"recipe": {"task": "kda", "family": fam, "params": {}, "steps": []}, "ir": None}
        assert t.precondition(g) is None
        assert {c["segments"] for c in t.choices(g)} == set(FAMILIES[fam]["space"]["segments"]) - {0}
        out = t.apply(g, {"segments": 64})
        assert out["recipe"]["params"]["segments"] == 64
        assert [k["name"].split("_")[2] for k in out["ir"]["kernels"][1:]] == ["ends", "starts", "outputs"]


SHAPES = [
    {"T": 177, "N": 6, "H": 2, "HV": 4, "VK": 1, "H0": 1, "PACK": 2},
    {"T": 409, "N": 5, "H": 1, "HV": 2, "VK": 0, "H0": 0, "PACK": 4},
    {"T": 277, "N": 5, "H": 2, "HV": 2, "VK": 1, "H0": 1, "PACK": 3},
    {"T": 100, "N": 1, "H": 2, "HV": 2, "VK": 0, "H0": 1, "PACK": 0},
    {"T": 8192, "N": 1, "H": 4, "HV": 4, "VK": 1, "H0": 1, "PACK": 0}]
# 2-chunk segments: many segments whose transitions M are far from 0 (over 64 chunks the gates decay
# them to exactly 0 in fp32, and the start states no longer depend on M)
POINTS = [dict(safe=True, segments=2), dict(safe=False, segments=2), dict(safe=True, segments=2, copy="bulk", vs=64),
          dict(safe=False, segments=4, vs=128, consumers=8, copy="bulk"), dict(safe=True, segments=64)]


@pytest.mark.gpu
@pytest.mark.parametrize("kw", POINTS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
@pytest.mark.parametrize("shape", SHAPES)
def test_seq_parallel_matches_float64_on_gpu(kw, shape):
    check_on_gpu(_program(**kw), {**shape, "SAFE": int(kw["safe"])}, seed=11)
