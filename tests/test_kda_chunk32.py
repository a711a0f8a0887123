"""The chunk-size axis of the two-pass KDA prefill: 32-token chunks (tasks/kda/two_pass.py, `chunk=32`).

(a) On the CPU in float64: the prepare kernel's composition of a 32-token chunk from two 16-token halves,
each prepared as a 16-token chunk with its own local gate (two_pass.HalfSink / cross_terms), equals the
direct 32-token formulas, for both gate forms (very negative softplus gates included) and with tokens
past the sequence end (q = k = v = 0, g = 0, beta = 0); and the recurrence over those pieces equals the
token recurrence (tasks/kda/reference.py).
(b) Every chunk-32 point of the two-pass family space that two_pass_problem accepts verifies, and its
kernels compile with NVRTC for sm_90a (and sm_80 where the loader copies with cp.async); the refused
points are refused with a reason.
(c) On a GPU (marked): the chunk-32 Programs against the float64 recurrence through the evaluator, on
the two-pass GPU test's shapes."""
import itertools

import numpy as np
import pytest

from cake_ir.compiler import compile_kernel
from cake_ir.verifier import verify

from test_kda_two_pass import SHAPES, check_on_gpu

HALF = 16


# ------------------------------------------------------------------------------------------ (a) algebra
def _decay(Ga, Gb):
    """e^{Ga_i - Gb_j} per channel, [i, j, K] (float64, the difference taken before the exp), for the
    pairs j <= i the masks keep (G falls down the tokens: those exponents are <= 0); the others, masked
    away, are clipped to e^0 so that nothing overflows."""
    return np.exp(np.minimum(Ga[:, None, :] - Gb[None, :, :], 0))


def _chunk_direct(q, k, g, beta):
    """The direct formulas of one chunk anchored at its start (q already carries the K^-1/2 scale)."""
    n = len(q)
    G = np.cumsum(g, axis=0)
    E = _decay(G, G)
    low = np.tril(np.ones((n, n)), -1)
    gram = np.einsum("id,jd,ijd->ij", k, k, E) * low
    Aqk = np.einsum("id,jd,ijd->ij", q, k, E) * (low + np.eye(n))
    Ainv = np.linalg.solve(np.eye(n) + beta[:, None] * gram, np.diag(beta))   # (I + Akk)^-1 Diag(beta)
    KG = k * np.exp(G)
    return dict(QG=q * np.exp(G), KG=KG, KD=k * np.exp(G[-1] - G), Aqk=Aqk, Ainv=Ainv, W=Ainv @ KG,
                Dec=np.exp(G[-1]))


def _chunk32_from_halves(q, k, g, beta):
    """The prepare kernel's composition (two_pass.HalfSink docstring), in float64."""
    h1 = _chunk_direct(q[:HALF], k[:HALF], g[:HALF], beta[:HALF])
    h2 = _chunk_direct(q[HALF:], k[HALF:], g[HALF:], beta[HALF:])
    D1, D2 = h1["Dec"], h2["Dec"]
    G21 = h2["KG"] @ h1["KD"].T
    P = h2["Ainv"] @ G21
    z = np.zeros((HALF, HALF))
    return dict(QG=np.vstack([h1["QG"], h2["QG"] * D1]),
                KD=np.vstack([h1["KD"] * D2, h2["KD"]]),
                Dec=D1 * D2,
                Aqk=np.block([[h1["Aqk"], z], [h2["QG"] @ h1["KD"].T, h2["Aqk"]]]),
                Ainv=np.block([[h1["Ainv"], z], [-P @ h1["Ainv"], h2["Ainv"]]]),
                W=np.vstack([h1["W"], h2["Ainv"] @ (h2["KG"] * D1) - P @ h1["W"]]))


def _inputs(rng, n: int, safe: bool, live: int = None, K: int = 32, V: int = 24):
    """n tokens of one head: normalised q (scaled) and k, v, log-space gates g, beta; tokens from
    `live` on are past the sequence end (zero, beta = 0, g = 0)."""
    q = rng.standard_normal((n, K))
    k = rng.standard_normal((n, K))
    q /= np.linalg.norm(q, axis=1, keepdims=True) * np.sqrt(K)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((n, V))
    if safe:
        g = -5 * rng.uniform(0, 1, (n, K)) ** 3          # in [-5, 0], many near 0 and some at the bound
    else:
        g = -np.exp(rng.uniform(np.log(1e-3), np.log(160), (n, K)))    # down to -160 per token
        g[rng.uniform(size=n) < 0.1] = -480.0                          # closed gates
    beta = 1 / (1 + np.exp(-rng.uniform(-10, 10, n)))
    if live is not None:
        for x in (q, k, v, g):
            x[live:] = 0
        beta[live:] = 0
    return q, k, v, g, beta


@pytest.mark.parametrize("safe", [True, False])
@pytest.mark.parametrize("live", [None, 32, 31, 20, 17, 16, 5, 1])
def test_chunk32_from_two_halves_equals_the_direct_formulas(safe, live):
    rng = np.random.default_rng(7 + (live or 0) + 100 * safe)
    for _ in range(5):
        q, k, _, g, beta = _inputs(rng, 32, safe, live)
        want, got = _chunk_direct(q, k, g, beta), _chunk32_from_halves(q, k, g, beta)
        for name in ("QG", "KD", "Dec", "Aqk", "Ainv", "W"):
            scale = max(np.abs(want[name]).max(), 1e-300)
            assert np.abs(got[name] - want[name]).max() <= 1e-12 * scale, name
        # block lower triangular: the upper-right blocks the prepare kernel writes as zeros
        assert not want["Aqk"][:HALF, HALF:].any() and np.abs(want["Ainv"][:HALF, HALF:]).max() < 1e-300
        # every factor the prepare kernel forms is <= 1 in magnitude per channel (nothing overflows)
        assert (want["Dec"] <= 1).all()


@pytest.mark.parametrize("safe", [True, False])
def test_chunk32_recurrence_over_the_composed_pieces_equals_the_token_recurrence(safe):
    """The recurrence kernel's per-step formulas over 32-token chunks built from halves (a partial
    last chunk padded with zero tokens), against reference.recurrent_sequence."""
    from tasks.kda.reference import recurrent_sequence
    rng = np.random.default_rng(11 + safe)
    n = 77
    q, k, v, g, beta = _inputs(rng, n, safe)
    S0 = rng.standard_normal((q.shape[1], v.shape[1])) * 0.1
    o_ref, S_ref = recurrent_sequence(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                                      S0[None], 1.0)
    S = S0.copy()
    o = np.zeros_like(v)
    for t0 in range(0, n, 32):
        t1 = min(n, t0 + 32)
        pad = lambda x: np.concatenate([x[t0:t1], np.zeros((32 - (t1 - t0),) + x.shape[1:])])   # noqa: E731
        qc, kc, vc, gc, bc = (pad(x) for x in (q, k, v, g, beta))
        c = _chunk32_from_halves(qc, kc, gc, bc)
        U = c["Ainv"] @ vc
        Vn = U - c["W"] @ S
        o[t0:t1] = (c["QG"] @ S + c["Aqk"] @ Vn)[:t1 - t0]
        S = c["Dec"][:, None] * S + c["KD"].T @ Vn
    assert np.abs(o - o_ref[:, 0]).max() <= 1e-10 * np.abs(o_ref).max()
    assert np.abs(S - S_ref[0]).max() <= 1e-10 * np.abs(S_ref).max()


# ------------------------------------------------------------------------------- (b) build / verify
def _space_points():
    """Every chunk-32 point of the two-pass families (segments 0: the sequence-parallel form is
    refused at chunk 32), with two_pass_problem's answer."""
    from tasks.kda.programs import FAMILIES
    from tasks.kda.two_pass import two_pass_problem
    out = []
    for fam in ("kda_two_pass_safe_sm90a", "kda_two_pass_softplus_sm90a"):
        f = FAMILIES[fam]
        assert f["space"]["chunk"] == [16, 32] and f["tactics"]["chunk_size"] == ["chunk"]
        names = [n for n in f["space"] if n not in ("chunk", "segments")]
        for vals in itertools.product(*[f["space"][n] for n in names]):
            p = {**f["defaults"], **dict(zip(names, vals)), "chunk": 32, "segments": 0}
            why = two_pass_problem(p["vs"], bool(p["safe"]), p["warps"], p["stages"], p["consumers"], 0,
                                   p["copy"], p["arch"], 32)
            out.append((p, why))
    return out


def test_chunk32_refusals_say_why():
    from tasks.kda.two_pass import kda_two_pass, two_pass_problem
    assert "chunk 16 only" in two_pass_problem(32, True, 1, 2, 4, segments=64, chunk=32)
    assert "must be one of 16, 32" in two_pass_problem(32, True, 1, 2, 4, chunk=64)
    with pytest.raises(ValueError, match="chunk 16 only"):
        kda_two_pass("sm_90a", 32, True, segments=64, chunk=32)
    refused = [(p, why) for p, why in _space_points() if why]
    accepted = [p for p, why in _space_points() if not why]
    assert accepted and all(isinstance(why, str) and why for _, why in refused)


def test_chunk32_names_carry_the_chunk():
    from tasks.kda.two_pass import CHUNK_BYTES, chunk_bytes, kda_two_pass
    prog = kda_two_pass("sm_90a", 32, True, copy="bulk", chunk=32)
    assert prog.name == "kda_two_pass32_vs32_w1_p2c4_bulk"
    assert [k.name for k in prog.kernels] == ["kda_prepare32_safe_w1_pitch136", "kda_recur32_vs32_safe_p2c4_bulk"]
    assert prog.workspace_tensor("wsAqk").shape == ["(T / 32 + N + 1) * HV * 32", 40]
    # three [32, 128] tiles at pitch 136, two [32, 32] at pitch 40, e^{G_C}: 512 bytes
    assert chunk_bytes(32) == 3 * (31 * 136 + 128) * 2 + 2 * (31 * 40 + 32) * 2 + 512 and CHUNK_BYTES == 15024
    rec = prog.kernels[1]
    assert [n.bytes for n in _loader_nodes(rec) if n.op == "mbar_expect_tx"] == [chunk_bytes(32)]


def _loader_nodes(rec):
    from cake_ir.walk import statements
    return [s.node for s in statements(rec) if s.role is not None and s.role.name == "load"]


_COMPILED = {}


def _compile_once(kernel, arch):
    """NVRTC compile of a kernel (the prepare kernels are shared by many points: once each)."""
    key = (kernel.model_dump_json(), arch)
    if key not in _COMPILED:
        r = compile_kernel(kernel, arch=arch)
        _COMPILED[key] = (r.ok, [d.short() for d in r.diagnostics if d.severity == "error"], r.resources)
    return _COMPILED[key]


@pytest.mark.parametrize("point", [p for p, why in _space_points() if not why],
                         ids=lambda p: f"{'safe' if p['safe'] else 'softplus'}-vs{p['vs']}-w{p['warps']}-"
                                       f"p{p['stages']}c{p['consumers']}-{p['copy']}")
def test_chunk32_point_verifies_and_compiles(point):
    from tasks.kda.programs import FAMILIES
    fam = FAMILIES["kda_two_pass_safe_sm90a" if point["safe"] else "kda_two_pass_softplus_sm90a"]
    prog = fam["make"](**point)
    res = verify(prog)
    assert res.ok, [d.short() for d in res.diagnostics if d.severity == "error"]
    from tasks.kda.two_pass import two_pass_problem
    sm80_problem = two_pass_problem(point["vs"], bool(point["safe"]), point["warps"], point["stages"],
                                    point["consumers"], 0, "cp_async", "sm_80", 32)
    for k in prog.kernels:
        prep = k is prog.kernels[0]
        for arch in ("sm_90a", "sm_80"):
            if arch == "sm_80" and point["copy"] == "bulk" and not prep:
                continue            # the bulk copy is sm_90a's
            if arch == "sm_80" and not prep and sm80_problem:
                assert "shared memory" in sm80_problem and _smem_over_sm80(k), sm80_problem
                continue            # an sm_90a family: 4 stages at vs 64 / 128 need more than sm_80's 163 KB
            ok, errs, resources = _compile_once(k, arch)
            assert ok, (k.name, arch, errs)
            # the prepare kernels sit at 255 registers: at chunk 32 sm_90a's ptxas spills up to 144 bytes
            # (safe gate with 2 warps; softplus 32-40), sm_80's 4 (softplus, 2 warps); the recurrence 8
            # at vs 128 with 4 stages and 8 consumers (sm_90a), none elsewhere
            limit = (160 if arch == "sm_90a" else 16) if prep else 8
            assert resources["spill_store_bytes"] <= limit, (k.name, arch, resources)


def _smem_over_sm80(kernel) -> bool:
    """Whether the verifier refuses `kernel` on sm_80 for its shared memory alone (E-RES-01)."""
    from cake_ir.compiler import with_arch
    res = verify(with_arch(kernel, "sm_80"))
    errs = [d for d in res.diagnostics if d.severity == "error"]
    return bool(errs) and all(d.code == "E-RES-01" for d in errs)


# --------------------------------------------------------------------------------------- (c) GPU
GPU_POINTS = [dict(vs=32, safe=True), dict(vs=32, safe=False),
              dict(vs=32, safe=True, warps=2, consumers=2, copy="bulk"), dict(vs=32, safe=False, copy="bulk"),
              dict(vs=64, safe=True), dict(vs=64, safe=False),
              dict(vs=128, safe=True, consumers=8), dict(vs=128, safe=False, consumers=8)]


@pytest.mark.gpu
@pytest.mark.parametrize("kw", GPU_POINTS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
@pytest.mark.parametrize("shape", SHAPES)
def test_chunk32_matches_float64_on_gpu(kw, shape):
    from tasks.kda.two_pass import kda_two_pass
    check_on_gpu(kda_two_pass(arch="sm_90a", chunk=32, **kw), {**shape, "SAFE": int(kw["safe"])}, seed=9)


def test_search_reaches_the_chunk_size_through_its_family_tactic():
    """The default search moves the two-pass seeds from chunk 16 to 32 and back (tactic chunk_size);
    the sequence-parallel points are not offered at chunk 32."""
    import tactics as T
    from cake_ir.io import to_dict
    from tasks.kda.programs import FAMILIES
    t = T.get_tactic("chunk_size")
    for fam in ("kda_two_pass_safe_sm90a", "kda_two_pass_softplus_sm90a"):
        f = FAMILIES[fam]
        g = {"recipe": {"task": "kda", "family": fam, "params": dict(f["defaults"]), "steps": []},
             "ir": to_dict(f["make"](**f["defaults"]))}
        assert t.applicable(g) is None and t.choices(g) == [{"chunk": 32}]
        out = t.apply(g, {"chunk": 32})
        assert out["ir"]["name"].startswith("kda_two_pass32_vs32_") and out["recipe"]["params"]["chunk"] == 32
        assert [k["name"].split("_")[1] for k in out["ir"]["kernels"]] == ["prepare32", "recur32"]
        assert t.choices(out) == [{"chunk": 16}]
        assert T.get_tactic("sequence_parallel").choices(out) == []
        assert t.apply(out, {"chunk": 16})["ir"] == g["ir"]
