"""KDA references on the CPU: the float64 recurrence against a naive loop written differently, the
chunked blueprint against the recurrence, varlen / grouped heads / layouts / causality, decode chained
after prefill, and the task objects (inputs, FLOP and byte counts)."""
import math

import numpy as np
import pytest

from gpu_backend.memory import round_to_bf16
from tasks.kda import reference as R
from tasks.kda.shapes import PACKS, seq_lens
from tasks.kda.task import DECODE_TASK, TASK


def _raw(T, H, HV, K, V, seed, hard=True):
    rng = np.random.default_rng(seed)
    x = dict(q=rng.standard_normal((T, H, K)) * 3, k=rng.standard_normal((T, H, K)),
             v=rng.standard_normal((T, HV, V)), f=rng.standard_normal((T, HV, K)) * 2,
             b=rng.standard_normal((T, HV)) * 2, A=np.log(rng.uniform(1, 16, HV)),
             dt=rng.standard_normal((HV, K)) - 2)
    if hard:   # very negative / at-the-bound gates on some tokens, near-zero decay on one head
        x["f"][rng.random(T) < 0.1] += 60.0
        x["f"][:, 0] -= 12.0
    return x


def _naive(x, cu, h0, safe, scale):
    """Scalar loops, per sequence / value head / token, the state kept transposed ([V][K])."""
    T, HV, V = x["v"].shape
    H, K = x["q"].shape[1:]
    G = HV // H
    o = np.zeros((T, HV, V))
    hts = []
    for n in range(len(cu) - 1):
        ht = []
        for hv in range(HV):
            h = hv // G
            St = [[0.0] * K for _ in range(V)] if h0 is None else [[float(h0[n, hv, a, c]) for a in range(K)]
                                                                     for c in range(V)]
            for t in range(cu[n], cu[n + 1]):
                qn = math.sqrt(sum(float(z) ** 2 for z in x["q"][t, h]) + 1e-6)
                kn = math.sqrt(sum(float(z) ** 2 for z in x["k"][t, h]) + 1e-6)
                q = [float(z) / qn for z in x["q"][t, h]]
                k = [float(z) / kn for z in x["k"][t, h]]
                beta = 1.0 / (1.0 + math.exp(-float(x["b"][t, hv])))
                for a in range(K):
                    z = float(x["f"][t, hv, a]) + float(x["dt"][hv, a])
                    A = math.exp(float(x["A"][hv]))
                    gk = -5.0 / (1.0 + math.exp(-A * z)) if safe else -A * (max(z, 0) + math.log1p(math.exp(-abs(z))))
                    for c in range(V):
                        St[c][a] *= math.exp(gk)
                for c in range(V):
                    err = float(x["v"][t, hv, c]) - sum(St[c][a] * k[a] for a in range(K))
                    for a in range(K):
                        St[c][a] += beta * err * k[a]
                    o[t, hv, c] = scale * sum(St[c][a] * q[a] for a in range(K))
            ht.append([[St[c][a] for c in range(V)] for a in range(K)])
        hts.append(ht)
    return o, np.array(hts)


def _fwd(x, cu=None, h0=None, safe=False, **kw):
    return R.kda_forward(x["q"], x["k"], x["v"], x["f"], x["b"], x["A"], x["dt"], cu, h0, safe=safe, **kw)


@pytest.mark.parametrize("safe", [False, True])
def test_recurrence_matches_naive_loop(safe):
    T, H, HV, K, V = 21, 2, 4, 6, 5
    x = _raw(T, H, HV, K, V, seed=1)
    cu = [0, 1, 9, 21]
    h0 = np.random.default_rng(2).standard_normal((3, HV, K, V))
    o, ht = _fwd(x, cu, h0, safe, method="recurrent")
    on, hn = _naive(x, cu, h0, safe, K ** -0.5)
    np.testing.assert_allclose(o, on, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ht, hn, rtol=1e-10, atol=1e-12)
    assert np.abs(o).max() > 1e-2 and np.abs(ht).max() > 1e-2


@pytest.mark.parametrize("safe,diag", [(False, "explicit"), (False, "recursive"), (False, "auto"),
                                       (True, "anchored"), (True, "auto")])
@pytest.mark.parametrize("chunk,sub", [(64, 16), (16, 4)])
def test_chunked_equals_recurrence(safe, diag, chunk, sub):
    T, H, HV, K, V = 150, 1, 2, 16, 8
    x = _raw(T, H, HV, K, V, seed=3)
    cu = [0, 1, 16, 17, 80, 150]                 # lengths 1, 15, 1, 63, 70: partial chunks everywhere
    h0 = np.random.default_rng(4).standard_normal((5, HV, K, V))
    g = R.kda_gate(x["f"], x["A"], x["dt"], safe)
    if safe:
        assert g.min() < -4.99                       # at the bound
    else:                                            # e^{cumulative gate} underflows even float64
        assert g.min() < -55 and g.sum(0).min() < -750
    o1, h1 = _fwd(x, cu, h0, safe, method="recurrent")
    o2, h2 = _fwd(x, cu, h0, safe, method="chunked", chunk=chunk, sub=sub, diag=diag)
    assert np.isfinite(o2).all() and np.isfinite(h2).all()
    assert np.abs(o1 - o2).max() <= 1e-10 * np.abs(o1).max()
    assert np.abs(h1 - h2).max() <= 1e-10 * np.abs(h1).max()


def test_anchored_diagonal_refuses_the_softplus_gate():
    x = _raw(64, 1, 1, 8, 4, seed=5)
    with pytest.raises(FloatingPointError):
        _fwd(x, None, None, False, method="chunked", diag="anchored", limit=80.0)


def test_varlen_pack_equals_separate_sequences():
    T, H, HV, K, V = 80, 2, 2, 8, 4
    x = _raw(T, H, HV, K, V, seed=6)
    cu = [0, 1, 17, 80]
    h0 = np.random.default_rng(7).standard_normal((3, HV, K, V))
    o, ht = _fwd(x, cu, h0)
    for n in range(3):
        s = slice(cu[n], cu[n + 1])
        xs = {a: (b[s] if a in ("q", "k", "v", "f", "b") else b) for a, b in x.items()}
        on, hn = _fwd(xs, None, h0[n:n + 1])
        np.testing.assert_allclose(o[s], on, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(ht[n], hn[0], rtol=1e-12, atol=1e-14)


def test_grouped_value_heads_share_q_and_k():
    T, H, HV, K, V = 30, 2, 6, 8, 4
    x = _raw(T, H, HV, K, V, seed=8)
    o, ht = _fwd(x)
    rep = dict(x, q=np.repeat(x["q"], 3, axis=1), k=np.repeat(x["k"], 3, axis=1))   # hv -> qk head hv // 3
    o2, ht2 = _fwd(rep)
    np.testing.assert_allclose(o, o2, rtol=1e-12)
    np.testing.assert_allclose(ht, ht2, rtol=1e-12)
    wrong = dict(x, q=np.tile(x["q"], (1, 3, 1)), k=np.tile(x["k"], (1, 3, 1)))      # hv -> hv % H: differs
    assert not np.allclose(_fwd(wrong)[0], o)


def test_state_layouts_round_trip():
    T, H, HV, K, V = 20, 1, 2, 8, 4
    x = _raw(T, H, HV, K, V, seed=9)
    h0 = np.random.default_rng(10).standard_normal((2, HV, K, V))
    cu = [0, 7, 20]
    o_kv, ht_kv = _fwd(x, cu, h0, layout="kv")
    o_vk, ht_vk = _fwd(x, cu, np.swapaxes(h0, -1, -2).copy(), layout="vk")
    assert ht_vk.shape == (2, HV, V, K)
    np.testing.assert_array_equal(o_kv, o_vk)
    np.testing.assert_array_equal(ht_kv, np.swapaxes(ht_vk, -1, -2))
    np.testing.assert_array_equal(R.state_to_kv(R.state_from_kv(ht_kv, "vk"), "vk"), ht_kv)


@pytest.mark.parametrize("method", ["recurrent", "chunked"])
def test_causality(method):
    """Perturbing token j leaves every output before j (and every other sequence) bit-identical and
    moves o_j; k, v, g and beta at j also move the later outputs of its sequence, q only o_j."""
    T, H, HV, K, V = 100, 1, 2, 8, 4
    x = _raw(T, H, HV, K, V, seed=11, hard=False)
    cu = [0, 70, 100]
    kw = {"chunk": 16, "sub": 4} if method == "chunked" else {}
    h0 = np.random.default_rng(13).standard_normal((2, HV, K, V))   # so the gate of token 0 matters
    o, ht = _fwd(x, cu, h0, method=method, **kw)

    def moved(a, b):
        return np.abs(a - b).max() > 1e-9 * np.abs(b).max()

    for j in (0, 33, 69, 85):
        seq = 0 if j < 70 else 1
        hi = cu[seq + 1]
        for name in ("q", "k", "v", "f", "b"):
            y = {a: b.copy() for a, b in x.items()}
            y[name][j] += 1.5
            o2, ht2 = _fwd(y, cu, h0, method=method, **kw)
            np.testing.assert_array_equal(o2[:j], o[:j])          # nothing before j moves
            np.testing.assert_array_equal(o2[hi:], o[hi:])        # nor another sequence
            np.testing.assert_array_equal(ht2[1 - seq], ht[1 - seq])
            assert moved(o2[j], o[j]), (j, name)
            if j + 1 < hi:
                assert moved(o2[j + 1:hi], o[j + 1:hi]) == (name != "q"), (j, name)


def test_decode_chain_equals_longer_prefill():
    """Serving level: prefill T tokens, then 16 decode steps through a shuffled state pool in the
    [V, K] layout, equals the prefill of T + 16 tokens (decoded outputs and final states)."""
    rng = np.random.default_rng(12)
    steps, N, H, HV, K, V = 16, 3, 1, 2, 8, 4
    lens = [23, 26, 14]
    full = [_raw(L + steps, H, HV, K, V, seed=100 + i) for i, L in enumerate(lens)]
    for i in range(1, N):       # the gate parameters belong to the layer, not the sequence
        full[i]["A"], full[i]["dt"] = full[0]["A"], full[0]["dt"]
    h0 = rng.standard_normal((N, HV, K, V))
    tokens = ("q", "k", "v", "f", "b")
    for safe in (False, True):
        ref = [_fwd(full[i], None, h0[i:i + 1], safe) for i in range(N)]
        pool = np.zeros((N, HV, V, K))
        slot = rng.permutation(N)
        for i in range(N):
            pre = {a: (b[:lens[i]] if a in tokens else b) for a, b in full[i].items()}
            pool[slot[i]] = _fwd(pre, None, np.swapaxes(h0[i:i + 1], -1, -2), safe, layout="vk")[1][0]
        for s in range(steps):
            step = [np.stack([full[i][n][lens[i] + s] for i in range(N)]) for n in tokens]
            o, pool = R.kda_decode(*step, full[0]["A"], full[0]["dt"], pool, slot, safe=safe, layout="vk")
            for i in range(N):
                np.testing.assert_allclose(o[i], ref[i][0][lens[i] + s], rtol=1e-9, atol=1e-12)
        for i in range(N):
            np.testing.assert_allclose(pool[slot[i]], np.swapaxes(ref[i][1][0], -1, -2), rtol=1e-9, atol=1e-12)


def test_decode_task_reference_is_one_recurrence_step():
    shape = DECODE_TASK.shapes[1]                          # B = 7, H = 2, HV = 4, safe, VK
    x = DECODE_TASK.make_inputs(shape, seed=5)
    ref = DECODE_TASK.reference(x, shape)
    B = shape["B"]
    o, ht = R.kda_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], np.arange(B + 1),
                          x["state"][x["idx"]], safe=True, layout="vk", method="recurrent")
    np.testing.assert_allclose(ref["o"], o, rtol=1e-12)
    np.testing.assert_allclose(ref["state_out"][x["idx"]], ht, rtol=1e-12)
    assert sorted(x["idx"].tolist()) == list(range(B))     # every slot is written once
    assert not np.allclose(ref["state_out"], x["state"])


@pytest.mark.parametrize("task", [TASK, DECODE_TASK], ids=["kda", "kda_decode"])
def test_make_inputs_deterministic_fresh_and_representable(task):
    shape = task.shapes[2]
    a, b, a2 = task.make_inputs(shape, 1), task.make_inputs(shape, 2), task.make_inputs(shape, 1)
    for spec in task.inputs(shape):
        x = a[spec.name]
        assert x.shape == spec.shape, spec
        assert np.array_equal(x, a2[spec.name], equal_nan=True)
        if spec.name != "cu_seqlens":
            assert not np.array_equal(x, b[spec.name], equal_nan=True), spec.name
        if spec.dtype == "bf16":
            assert np.array_equal(round_to_bf16(x), x) and np.count_nonzero(x) > 0.99 * x.size
        if spec.dtype == "i32":
            assert np.array_equal(x.astype(np.int32), x)
    for spec in task.outputs(shape):
        assert spec.dtype in ("bf16", "f32")


def test_prefill_inputs_cover_the_gate_edges_and_reference_is_finite():
    for shape in TASK.shapes:
        x = TASK.make_inputs(shape, seed=3)
        cu = x["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == shape["T"] and list(np.diff(cu)) == list(seq_lens(shape))
        assert np.isnan(x["h0"]).all() == (not shape["H0"])
        g = R.kda_gate(x["g"], x["A_log"], x["dt_bias"], bool(shape["SAFE"]))
        if shape["SAFE"]:
            assert g.min() < -4.99 and g.max() > -1e-3          # at the bound and near zero decay
        else:
            assert g.min() < -20 and g.max() > -1e-2           # very negative and near zero
            assert g.sum(0).min() < -700                       # e^{cumulative gate} underflows fp32 and f64
        beta = R.sigmoid(x["beta"].astype(np.float64))
        assert beta.min() < 1e-4 and beta.max() > 1 - 1e-4
    shape = TASK.shapes[3]                                     # PACK 2: lengths 1, 15, 16, 17, 63, 65; no h0
    x = TASK.make_inputs(shape, seed=0)
    ref = TASK.reference(x, shape)
    assert ref["o"].shape == (shape["T"], shape["HV"], 128) and np.isfinite(ref["o"]).all()
    assert np.isfinite(ref["ht"]).all() and np.abs(ref["ht"]).max() > 1e-3
    ch = TASK.reference(x, shape, method="chunked")
    for n in ref:
        assert np.abs(ch[n] - ref[n]).max() <= 1e-9 * np.abs(ref[n]).max()


def test_flops_and_bytes():
    s = {"T": 8192, "N": 1, "H": 32, "HV": 32, "SAFE": 1, "VK": 1, "H0": 1, "PACK": 0}
    assert TASK.flops(s) == pytest.approx(47.2e9, rel=0.01)             # the design note's ~45 GFLOP floor
    assert TASK.bytes(s) == pytest.approx(0.34e9, rel=0.03)             # ~0.34 GB compulsory traffic
    assert TASK.flops(dict(s, T=16384)) == 2 * TASK.flops(s)
    assert TASK.flops(dict(s, HV=64, H=64)) == 2 * TASK.flops(s)
    assert TASK.bytes(dict(s, H0=0)) == TASK.bytes(s) - 4 * 32 * 128 * 128
    d = {"B": 256, "H": 32, "HV": 32, "SAFE": 1, "VK": 1}
    assert DECODE_TASK.bytes(d) == pytest.approx(8 * 256 * 32 * 128 * 128, rel=0.02)   # state in + out
    assert DECODE_TASK.bytes(dict(d, B=1)) * 200 < DECODE_TASK.bytes(d)
    for t in (TASK, DECODE_TASK):
        for shape in t.shapes + t.bench_shapes:
            assert t.flops(shape) > 0 and t.bytes(shape) > 0
            names = [x.name for x in t.inputs(shape) + t.outputs(shape)]
            assert len(names) == len(set(names))
            assert set(t.scalars(shape)) <= set(shape)


def test_bench_shapes_are_the_issues():
    rows = {(s["T"], s["N"], s["H"], s["PACK"], s["SAFE"]) for s in TASK.bench_shapes}
    for T, N, H, P in [(8192, 1, 32, 0), (8192, 1, 64, 0), (8192, 1, 96, 0), (32768, 1, 32, 0),
                       (8192, 6, 64, 1), (8192, 8, 64, 0), (8192, 8, 96, 0)]:
        assert {(T, N, H, P, 0), (T, N, H, P, 1)} <= rows
    assert PACKS[1] == (1300, 547, 2048, 963, 271, 3063) and PACKS[2] == (1, 15, 16, 17, 63, 65)
    assert {(s["B"], s["H"]) for s in DECODE_TASK.bench_shapes} == {(b, 32) for b in (1, 16, 64, 256)}


def test_registry_and_baseline_shape_guard():
    from agent.baselines import _kda_shape
    from tasks.registry import DEFAULT_BASELINES, discover
    found = discover()
    assert "kda" in found and "kda_decode" in found
    assert DEFAULT_BASELINES["kda"][0]["call"] == "agent.baselines:kda_chunk_fla"
    shape = TASK.shapes[0]
    x = TASK.make_inputs(shape, seed=0)
    with pytest.raises(TypeError):                # not the bench shape and no shape= given
        _kda_shape(x, None, decode=False)
    assert _kda_shape(x, shape, decode=False) == shape
