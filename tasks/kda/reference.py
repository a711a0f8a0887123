"""Float64 references for Kimi Delta Attention (KDA), forward: the token recurrence (the definition) and
the chunked WY form the kernels implement (the blueprint). Pure numpy.

Semantics are those of fla-core 0.6.0 (`fla.ops.kda`) with the flags
`use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
allow_neg_eigval=False` (sources, all in the fla-core 0.6.0 wheel):

- L2 norm (fla/modules/norm/l2norm.py `l2norm_fwd`, eps=1e-6; fused_recurrent.py the same in-kernel):
  x / sqrt(sum(x^2) + 1e-6), over the K channels of each token and qk head.
- gate (fla/ops/kda/gate.py `naive_kda_gate`, `naive_kda_lowerbound_gate`,
  `kda_gate_chunk_cumsum_vector_kernel`), raw input f [T, HV, K], A_log [HV], dt_bias [HV, K]
  (fla takes it flattened, [HV*K]):
    softplus form (lower_bound None):  g = -exp(A_log) * softplus(f + dt_bias)
    lower-bound ("safe") form:         g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias))
  fla selects the lower-bound form whenever `lower_bound` is given (USE_LOWER_BOUND); chunk_kda's
  `safe_gate=True` additionally requires lower_bound in [-5, 0) and enables its M=16 fast path.
  fla's softplus returns x for x > 20 (fla/ops/utils/softplus.py); here the exact log(1 + e^x)
  (a relative difference below 2e-9 there).
- beta = sigmoid(beta_logit) (fla/ops/common/gate.py `fused_beta_sigmoid`, scale 1).
- grouped value heads (GVA, HV = G*H): value head hv uses qk head hv // G (naive.py
  `repeat_interleave(G, dim=2)`; fused_recurrent.py `i_h = i_hv // (HV // H)`); g, beta, A_log,
  dt_bias, the state and the output are per value head.
- recurrence (fla/ops/kda/naive.py `naive_recurrent_kda`, fused_recurrent.py), per value head:
    S <- S * exp(g_t)[:, None]                  decay first (S is K x V)
    S <- S + beta_t k_t (v_t - S^T k_t)^T        delta rule on the decayed state
    o_t = S^T (scale * q_t)                      scale = K^-0.5 by default
- state layouts: "kv" is fla's default [N, HV, K, V]; "vk" is `state_v_first=True`, [N, HV, V, K]
  (the transpose of each head's state). Initial state fp32, optional; each packed sequence
  (cu_seqlens, B = 1) starts from its own initial state (or zeros) and ends in its own final state.

fla rounds the normalised q and k to the input dtype (bf16) in its chunk path; this reference does
not (float64 throughout): that rounding is part of a kernel's error budget, not of the definition.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

L2_EPS = 1e-6
LOWER_BOUND = -5.0   # the value fla and FlashKDA recommend for the safe gate


# --------------------------------------------------------------------------- activations
def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Overflow-free logistic function (exact in both tails)."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def l2norm(x: np.ndarray, eps: float = L2_EPS) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def kda_gate(f: np.ndarray, A_log: np.ndarray, dt_bias: Optional[np.ndarray], safe: bool,
             lower_bound: float = LOWER_BOUND) -> np.ndarray:
    """Log-space decay g [..., HV, K] from the raw gate input f [..., HV, K] (see module docstring)."""
    x = np.asarray(f, dtype=np.float64)
    HV, K = x.shape[-2:]
    if dt_bias is not None:
        x = x + np.asarray(dt_bias, dtype=np.float64).reshape(HV, K)
    a = np.exp(np.asarray(A_log, dtype=np.float64).reshape(HV, 1))
    if safe:
        return lower_bound * sigmoid(a * x)
    return -a * softplus(x)


def expand_heads(x: np.ndarray, HV: int) -> np.ndarray:
    """[.., H, K] qk heads -> [.., HV, K]: value head hv reads qk head hv // (HV // H)."""
    H = x.shape[-2]
    if HV % H:
        raise ValueError(f"HV={HV} is not a multiple of H={H}")
    return np.repeat(x, HV // H, axis=-2)


# --------------------------------------------------------------------------- state layouts
def state_to_kv(S: np.ndarray, layout: str) -> np.ndarray:
    """A state tensor [..., K, V] ("kv") or [..., V, K] ("vk") as [..., K, V] (float64 copy)."""
    if layout not in ("kv", "vk"):
        raise ValueError(f"state layout {layout!r}: 'kv' or 'vk'")
    S = np.asarray(S, dtype=np.float64)
    return np.array(S if layout == "kv" else np.swapaxes(S, -1, -2), order="C")   # C order: same sums either way


def state_from_kv(S: np.ndarray, layout: str) -> np.ndarray:
    if layout not in ("kv", "vk"):
        raise ValueError(f"state layout {layout!r}: 'kv' or 'vk'")
    return np.ascontiguousarray(S if layout == "kv" else np.swapaxes(S, -1, -2))


# --------------------------------------------------------------------------- one sequence
def recurrent_sequence(q, k, v, g, beta, S0, scale: float):
    """The token recurrence for one sequence, all value heads at once (activated inputs, float64).

    q, k [L, HV, K] (normalised, expanded to value heads), v [L, HV, V], g [L, HV, K] (log decay),
    beta [L, HV], S0 [HV, K, V] -> (o [L, HV, V], S_L [HV, K, V])."""
    S = np.array(S0, dtype=np.float64)
    L, HV, V = v.shape
    o = np.empty((L, HV, V))
    for t in range(L):
        S *= np.exp(g[t])[:, :, None]                       # decay first
        kS = np.matmul(k[t][:, None, :], S)[:, 0, :]         # S^T k, [HV, V]
        u = beta[t][:, None] * (v[t] - kS)                   # the delta-rule correction
        S += k[t][:, :, None] * u[:, None, :]
        o[t] = np.matmul((scale * q[t])[:, None, :], S)[:, 0, :]
    return o, S


def _decayed_gram(a, b, G, strict: bool, sub: int, diag: str, limit: float):
    """M[r, c] = sum_d a[r, d] b[c, d] exp(G[r, d] - G[c, d]) for c < r (strict) or c <= r, over a
    batch of chunks: a, b, G [Bt, C, K] -> [Bt, C, C], zero above the diagonal.

    Every exponent that is evaluated is <= 0 (each factor <= 1), which is what a fp32 kernel must
    do for the unbounded softplus gate:
    - off-diagonal sub-blocks (rows in sub-block i, columns in sub-block j < i) factor through the
      anchor n = the last token of sub-block j: (a_r e^{G_r - G_n}) . (b_c e^{G_n - G_c}), both
      factors <= 1 because c <= n < r; one matmul per sub-block pair;
    - diagonal sub-blocks, by `diag`:
      "explicit": e^{G_r - G_c} per (r, c, d) (token-parallel, no matmul: what fla does for the
        softplus gate, and what a CAKE kernel must do there);
      "recursive": the same decomposition again inside the sub-block (sub-blocks of sub/4, explicit
        at 4 tokens): exact like "explicit", much cheaper in numpy;
      "anchored": factor through the token before the sub-block (rows <= 1, columns up to
        e^{range}); valid only when the sub-block's decay range is small: the safe gate, 16 tokens x
        5 = 80 < 88 (the fp32 exp limit) -- the shortcut the softplus gate cannot take;
      "auto": anchored where the range <= `limit`, else recursive.
    """
    Bt, C, K = a.shape
    out = np.zeros((Bt, C, C))
    for i in range(0, C, sub):
        ri = slice(i, min(i + sub, C))
        for j in range(0, i, sub):
            cj = slice(j, min(j + sub, C))
            n = cj.stop - 1
            rows = a[:, ri] * np.exp(G[:, ri] - G[:, n:n + 1])
            cols = b[:, cj] * np.exp(G[:, n:n + 1] - G[:, cj])
            out[:, ri, cj] = np.matmul(rows, np.swapaxes(cols, -1, -2))
        out[:, ri, ri] = _diag_block(a[:, ri], b[:, ri], G[:, ri], G[:, i - 1:i] if i > 0 else None,
                                     strict, sub, diag, limit)
    return out


def _diag_block(a, b, Gi, anchor, strict, sub, diag, limit):
    Bt, s, K = a.shape
    anchor = np.zeros((Bt, 1, K)) if anchor is None else anchor
    rng = (anchor - Gi[:, -1:]).max(axis=(1, 2))                # decay range of the sub-block
    if diag == "anchored" and (rng > limit).any():
        raise FloatingPointError(f"anchored diagonal sub-block with decay range {rng.max():.1f} > {limit}")
    use_anchor = {"anchored": np.ones(Bt, bool), "auto": rng <= limit}.get(diag, np.zeros(Bt, bool))
    mask = np.tril(np.ones((s, s), bool), -1 if strict else 0)
    blk = np.zeros((Bt, s, s))
    if use_anchor.any():
        ia = np.flatnonzero(use_anchor)
        rows = a[ia] * np.exp(Gi[ia] - anchor[ia])
        cols = b[ia] * np.exp(anchor[ia] - Gi[ia])
        blk[ia] = np.matmul(rows, np.swapaxes(cols, -1, -2))
    ie = np.flatnonzero(~use_anchor)
    if ie.size and diag in ("recursive", "auto") and s > 4:
        blk[ie] = _decayed_gram(a[ie], b[ie], Gi[ie], strict, max(4, s // 4), "recursive", limit)
    else:
        for p in range(0, ie.size, 64):                          # bounded temporaries: [64, s, s, K]
            idx = ie[p:p + 64]
            d = Gi[idx][:, :, None, :] - Gi[idx][:, None, :, :]  # G_r - G_c, <= 0 where c <= r
            e = np.exp(np.minimum(d, 0.0))
            blk[idx] = (a[idx][:, :, None, :] * b[idx][:, None, :, :] * e).sum(-1)
    return np.where(mask, blk, 0.0)


def chunked_sequence(q, k, v, g, beta, S0, scale: float, chunk: int = 64, sub: int = 16,
                     diag: str = "auto", limit: float = 600.0, group: int = 64):
    """The chunked (WY / UT-transform) form of `recurrent_sequence`, same arguments and results.

    Per chunk of C tokens (cumulative gate G within the chunk, all exponents <= 0 or anchored):
        Akk = Diag(beta) tril_{c<r}(K K^T o e^{G_r - G_c})        (_decayed_gram)
        A   = (I + Akk)^-1                                     unit lower triangular
        W   = A Diag(beta) (K o e^G),   U = A Diag(beta) V     (e^G relative to the chunk start <= 1)
        Aqk = scale tril_{c<=r}(Q K^T o e^{G_r - G_c})
        Vn  = U - W S;   O = scale (Q o e^G) S + Aqk Vn
        S   = Diag(e^{G_last}) S + (K o e^{G_last - G})^T Vn
    A partial last chunk is padded with zero tokens (k = v = q = 0, g = 0, beta = 0), which is exact:
    they come after every real token, add nothing to the state and leave G_last unchanged.
    The intra-chunk part is batched over chunks and heads; only the state pass is sequential."""
    L, HV, V = v.shape
    K = k.shape[-1]
    S = np.array(S0, dtype=np.float64)
    o = np.empty((L, HV, V))
    eye = np.eye(chunk)
    step = max(1, group // HV) * chunk                           # tokens per batch of chunks
    for t0 in range(0, L, step):                                 # batches of chunks: cache-sized temporaries
        t1 = min(L, t0 + step)
        n = -(-(t1 - t0) // chunk)
        pad = n * chunk - (t1 - t0)

        def chunks(x):   # [tokens, HV, ...] -> [n * HV, C, ...] (zero tokens pad the last chunk)
            x = np.asarray(x[t0:t1], dtype=np.float64)
            x = np.concatenate([x, np.zeros((pad,) + x.shape[1:])]) if pad else x
            x = np.moveaxis(x.reshape((n, chunk) + x.shape[1:]), 1, 2)
            return x.reshape((n * HV,) + x.shape[2:])

        qc, kc, vc, gc, bc = (chunks(x) for x in (q, k, v, g, beta))
        G = np.cumsum(gc, axis=1)                                # [n*HV, C, K], <= 0
        eG = np.exp(G)
        Akk = bc[:, :, None] * _decayed_gram(kc, kc, G, True, sub, diag, limit)
        A = np.linalg.solve(eye + Akk, np.broadcast_to(eye, Akk.shape))
        W = np.matmul(A, bc[:, :, None] * kc * eG)               # [n*HV, C, K]
        U = np.matmul(A, bc[:, :, None] * vc)                    # [n*HV, C, V]
        Aqk = scale * _decayed_gram(qc, kc, G, False, sub, diag, limit)
        qg = scale * qc * eG                                     # Q o e^G
        Glast = G[:, -1:, :]
        kd = kc * np.exp(Glast - G)                              # K o e^{G_last - G}, <= 1
        shp = lambda x: x.reshape((n, HV) + x.shape[1:])        # noqa: E731
        W, U, Aqk, qg, kd, Glast = (shp(x) for x in (W, U, Aqk, qg, kd, Glast))
        oc = np.empty((n, HV, chunk, V))
        for c in range(n):                                       # the sequential state pass
            Vn = U[c] - np.matmul(W[c], S)
            oc[c] = np.matmul(qg[c], S) + np.matmul(Aqk[c], Vn)
            S = np.exp(Glast[c, :, 0, :])[:, :, None] * S + np.matmul(np.swapaxes(kd[c], -1, -2), Vn)
        o[t0:t1] = np.moveaxis(oc, 2, 1).reshape(n * chunk, HV, V)[:t1 - t0]
    return o, S


# --------------------------------------------------------------------------- packed batches
def kda_activated(q, k, v, g, beta, cu_seqlens=None, h0=None, *, scale: Optional[float] = None,
                  layout: str = "kv", method: str = "recurrent", **chunk_kw):
    """KDA over a packed batch from activated inputs: q, k [T, H, K] (already normalised), v [T, HV, V],
    g [T, HV, K] (log decay), beta [T, HV] in (0, 1); cu_seqlens [N+1] (None: one sequence); h0
    [N, HV, K, V] in `layout` or None -> (o [T, HV, V], ht [N, HV, K, V] in `layout`), float64."""
    v = np.asarray(v, dtype=np.float64)
    T, HV, V = v.shape
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    qe = expand_heads(np.asarray(q, dtype=np.float64), HV)
    ke = expand_heads(np.asarray(k, dtype=np.float64), HV)
    g = np.asarray(g, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    cu = np.array([0, T]) if cu_seqlens is None else np.asarray(cu_seqlens, dtype=np.int64)
    if cu[0] != 0 or cu[-1] != T or (np.diff(cu) < 0).any():
        raise ValueError(f"cu_seqlens {cu.tolist()} does not partition {T} tokens")
    N = cu.size - 1
    h0kv = np.zeros((N, HV, K, V)) if h0 is None else state_to_kv(h0, layout)
    run = {"recurrent": recurrent_sequence, "chunked": chunked_sequence}[method]
    o = np.empty((T, HV, V))
    ht = np.empty((N, HV, K, V))
    for i in range(N):
        s = slice(int(cu[i]), int(cu[i + 1]))
        kw = chunk_kw if method == "chunked" else {}
        o[s], ht[i] = run(qe[s], ke[s], v[s], g[s], beta[s], h0kv[i], scale, **kw)
    return o, state_from_kv(ht, layout)


# token-heads (T * HV) up to which "auto" runs the token recurrence itself; above, numpy's recurrence
# takes minutes, and the task's reference goes to the chunked form (or the GPU, tasks/kda/task.py)
RECURRENT_MAX_TOKEN_HEADS = 32768


def kda_forward(q, k, v, f, beta_logit, A_log, dt_bias, cu_seqlens=None, h0=None, *, safe: bool,
                lower_bound: float = LOWER_BOUND, scale: Optional[float] = None, layout: str = "kv",
                method: str = "auto", **chunk_kw):
    """KDA prefill from raw inputs (fla: chunk_kda with use_qk_l2norm_in_kernel, use_gate_in_kernel,
    use_beta_sigmoid_in_kernel; safe_gate + lower_bound for the safe gate). q, k [T, H, K], v
    [T, HV, V], f [T, HV, K] raw gate input, beta_logit [T, HV], A_log [HV], dt_bias [HV, K].
    method "auto": the token recurrence for small problems (the definition), the chunked form
    (tested equal to it to ~1e-10) when T * HV > RECURRENT_MAX_TOKEN_HEADS."""
    if method == "auto":
        method = "recurrent" if np.shape(v)[0] * np.shape(v)[1] <= RECURRENT_MAX_TOKEN_HEADS else "chunked"
    g = kda_gate(f, A_log, dt_bias, safe, lower_bound)
    return kda_activated(l2norm(q), l2norm(k), v, g, sigmoid(np.asarray(beta_logit, dtype=np.float64)),
                         cu_seqlens, h0, scale=scale, layout=layout, method=method, **chunk_kw)


def kda_decode(q, k, v, f, beta_logit, A_log, dt_bias, pool, idx, *, safe: bool,
               lower_bound: float = LOWER_BOUND, scale: Optional[float] = None, layout: str = "kv"):
    """One decode step: sequence b (q, k [B, H, K], v [B, HV, V], f [B, HV, K], beta_logit [B, HV])
    continues from pool[idx[b]] (pool [P, HV, K, V] in `layout`) -> (o [B, HV, V], pool_out): a copy
    of the pool with slot idx[b] replaced by sequence b's new state (fla: fused_recurrent_kda with
    ssm_state_indices, in-place final state)."""
    idx = np.asarray(idx, dtype=np.int64)
    if len(set(idx.tolist())) != idx.size:
        raise ValueError("decode state indices must be distinct")
    B = idx.size
    h0 = np.asarray(pool)[idx]
    o, ht = kda_forward(q, k, v, f, beta_logit, A_log, dt_bias, np.arange(B + 1), h0, safe=safe, lower_bound=lower_bound, scale=scale, layout=layout,
                        method="recurrent")
    out = np.array(pool, dtype=np.float64)
    out[idx] = ht
    return o, out
