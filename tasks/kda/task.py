"""Kimi Delta Attention prefill (fla `chunk_kda` semantics): packed variable-length sequences (B = 1,
cu_seqlens), bf16 raw inputs with the q/k L2 norm, the gate activation (softplus or lower-bound safe
gate) and the beta sigmoid done in the kernel, fp32 initial and final states in either layout, grouped
value heads; rel RMSE <= 5e-3 against the float64 recurrence for o and the final state, NaN never.

Inputs (T tokens, N sequences, H qk heads, HV value heads, K = V = 128):
  q, k [T, H, K] bf16 (raw; the kernel L2-normalises: x / sqrt(sum x^2 + 1e-6)); v [T, HV, V] bf16;
  g [T, HV, K] bf16 raw gate input; beta [T, HV] bf16 logits (beta = sigmoid); A_log [HV] f32;
  dt_bias [HV, K] f32; h0 [N, HV, K, V] (VK = 0) or [N, HV, V, K] (VK = 1) f32; cu_seqlens [N+1] i32.
Outputs: o [T, HV, V] bf16; ht [N, HV, K, V] or [N, HV, V, K] f32.
Scalars: T, N, H, HV, SAFE, VK, H0 (see tasks/kda/shapes.py); lower_bound = -5, scale = K^-0.5.

Gate (per value head hv and channel d, x = g + dt_bias): SAFE = 1: lower_bound * sigmoid(exp(A_log) x);
SAFE = 0: -exp(A_log) softplus(x). With H0 = 0 every sequence starts from zeros and h0 holds NaN: a
kernel must not read it. Inputs carry very negative gates (softplus: down to about -480 per token),
gates at the bound (safe), near-zero decay (long memory), beta near 0 and 1, and q/k with norms from
1e-2 to 30 per token. The math, sources and the chunked algorithm: docs/tasks-kda.md.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from gpu_backend.memory import round_to_bf16
from tasks.base import BaseTask, TensorSpec, Tolerance
from tasks.kda import reference as R
from tasks.kda.shapes import DECODE_BENCH, DECODE_TEST, K, PREFILL_BENCH, PREFILL_TEST, V, seq_lens

CHUNK = 64          # the chunk size the FLOP count assumes (fla's and the blueprint's)
SCALARS = ("T", "N", "H", "HV", "SAFE", "VK", "H0")


def _bf16(x) -> np.ndarray:
    return round_to_bf16(np.asarray(x, dtype=np.float32))


def gate_params(HV: int, rng: np.random.Generator):
    """A_log, dt_bias as Kimi Linear initialises them: A = exp(A_log) ~ U(1, 16) (fla layers/kda.py);
    dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1] (the Mamba-style dt init)."""
    A_log = np.log(rng.uniform(1.0, 16.0, HV)).astype(np.float32)
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), (HV, K)))
    dt_bias = (dt + np.log(-np.expm1(-dt))).astype(np.float32)
    return A_log, dt_bias


def raw_token_inputs(T: int, H: int, HV: int, rng: np.random.Generator) -> dict:
    """q, k, v, g (raw gate), beta (logits) for T tokens, bf16-representable float32, with edge values.

    Value heads cycle through gate regimes (hv % 3): 0 typical; 1 strong decay (softplus: g of about
    -4 to -160 per token, so the cumulative gate leaves the fp32 exp range within a chunk; safe: at the
    bound); 2 near-zero decay (the state persists across chunks). 4% of the tokens (at least one)
    close every gate hard (raw input 20..30: softplus g down to -480, safe g = -5) and 6% of the
    (token, head) pairs (at least one) carry beta logits of +-10."""
    tok = 10.0 ** rng.uniform(-2.0, 1.5, (T, 1, 1))                # per-token norms: the L2 norm matters
    q = rng.standard_normal((T, H, K)) * tok
    k = rng.standard_normal((T, H, K)) * 10.0 ** rng.uniform(-2.0, 1.5, (T, 1, 1))
    v = rng.standard_normal((T, HV, V))
    g = rng.standard_normal((T, HV, K)) * 1.5
    cls = np.arange(HV) % 3
    g[:, cls == 1] += rng.uniform(4.0, 10.0, (T, int((cls == 1).sum()), K))
    g[:, cls == 2] -= 10.0
    hard = rng.choice(T, max(1, round(0.04 * T)), replace=False)
    g[hard] = rng.uniform(20.0, 30.0, (hard.size, HV, K))
    beta = rng.standard_normal((T, HV)) * 2.0
    ext = rng.choice(T * HV, max(2, round(0.06 * T * HV)), replace=False)
    beta.reshape(-1)[ext] = np.resize([-10.0, 10.0], ext.size)
    return {"q": _bf16(q), "k": _bf16(k), "v": _bf16(v), "g": _bf16(g), "beta": _bf16(beta)}


def state_values(shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """fp32 states of the magnitude a running sequence has (entries O(0.1 - 1))."""
    return (rng.standard_normal(shape) * rng.uniform(0.1, 1.0, shape[:-2] + (1, 1))).astype(np.float32)


class KdaPrefillTask(BaseTask):
    name = "kda"
    shapes = PREFILL_TEST
    bench_shapes = PREFILL_BENCH
    # a worker's first profile job builds the run's bench inputs and float64 reference (numpy + GPU torch,
    # tens of seconds cold; later workers read them from the disk cache); --timed-shapes class on a cold
    # cache builds all 7 of a class (about a minute): give it --deadline 300
    job_seconds = 120.0
    tolerance = Tolerance(rel_rmse=5e-3)          # per output (o, ht): the level public kernels are held to
    shape_class_keys = ("SAFE",)                  # a kernel may serve one gate form (the chunked ones do)
    k_dim, v_dim, chunk = K, V, CHUNK

    def _state_shape(self, shape):
        N, HV = shape["N"], shape["HV"]
        return (N, HV, V, K) if shape["VK"] else (N, HV, K, V)

    def inputs(self, shape):
        T, N, H, HV = shape["T"], shape["N"], shape["H"], shape["HV"]
        return [TensorSpec("q", (T, H, K), "bf16"), TensorSpec("k", (T, H, K), "bf16"),
                TensorSpec("v", (T, HV, V), "bf16"), TensorSpec("g", (T, HV, K), "bf16"),
                TensorSpec("beta", (T, HV), "bf16"), TensorSpec("A_log", (HV,), "f32"),
                TensorSpec("dt_bias", (HV, K), "f32"), TensorSpec("h0", self._state_shape(shape), "f32"),
                TensorSpec("cu_seqlens", (N + 1,), "i32")]

    def outputs(self, shape):
        T, HV = shape["T"], shape["HV"]
        return [TensorSpec("o", (T, HV, V), "bf16"), TensorSpec("ht", self._state_shape(shape), "f32")]

    def scalars(self, shape):
        return {n: int(shape[n]) for n in SCALARS}

    def make_inputs(self, shape, seed: int, rng: Optional[np.random.Generator] = None):
        rng = self.rng_for(seed, rng)
        T, H, HV = shape["T"], shape["H"], shape["HV"]
        lens = seq_lens(shape)
        x = raw_token_inputs(T, H, HV, rng)
        x["A_log"], x["dt_bias"] = gate_params(HV, rng)
        if shape["H0"]:
            x["h0"] = state_values(self._state_shape(shape), rng)
        else:   # no initial state: NaN, so a kernel that reads it anyway fails with "nan"
            x["h0"] = np.full(self._state_shape(shape), np.nan, np.float32)
        x["cu_seqlens"] = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        return x

    def reference(self, inputs, shape, method: str = "auto"):
        """float64 outputs. method "auto": the token recurrence on the GPU (tasks/kda/torch_ref.py) for
        shapes the numpy recurrence is too slow for (the bench shapes) when a CUDA torch is there, else
        numpy (tasks/kda/reference.py: the recurrence, or its exact chunked form)."""
        if method == "auto" and shape["T"] * shape["HV"] > R.RECURRENT_MAX_TOKEN_HEADS:
            from tasks.kda import torch_ref
            if torch_ref.cuda_torch():
                return torch_ref.reference_on_device(inputs, shape)
        o, ht = R.kda_forward(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], inputs["A_log"],
                              inputs["dt_bias"], inputs["cu_seqlens"], inputs["h0"] if shape["H0"] else None,
                              safe=bool(shape["SAFE"]), layout="vk" if shape["VK"] else "kv", method=method)
        return {"o": o, "ht": ht}

    def flops(self, shape):
        """Matmul FLOPs of the chunked algorithm at C = 64 per token and value head: 6 K V for the
        state products (W S, Q S, K^T Vnew) plus 2 C (3 K + 2 V) for the intra-chunk ones (Akk, Aqk,
        W = A (K e^G), U = A V, Aqk Vnew; full C x C tiles), i.e. 180224 at K = V = 128 (47 GFLOP for
        T = 8192, HV = 32). Element-wise work and the inverse are not counted."""
        per = 6 * K * V + 2 * self.chunk * (3 * K + 2 * V)
        return float(shape["T"] * shape["HV"] * per)

    def bytes(self, shape):
        """Compulsory traffic: every input element once (h0 only when read), o and ht once."""
        T, N, H, HV = shape["T"], shape["N"], shape["H"], shape["HV"]
        tok = 2 * (2 * T * H * K + T * HV * V + T * HV * K + T * HV) + 2 * T * HV * V
        state = 4 * N * HV * K * V * (1 + int(shape["H0"]))
        return float(tok + state + 4 * HV * (1 + K) + 4 * (N + 1))


class KdaDecodeTask(BaseTask):
    """One decode step for B sequences (fla `fused_recurrent_kda` with a state pool, as serving engines
    call it): sequence b reads state[idx[b]] and its new state goes to slot idx[b] of state_out.

    Inputs: q, k [B, H, K] bf16; v [B, HV, V]; g [B, HV, K] raw gate; beta [B, HV] logits (bf16);
    A_log [HV], dt_bias [HV, K] f32; state [P, HV, K, V] or [P, HV, V, K] f32 (the pool, P = B); idx
    [B] i32 (a permutation of the slots). Outputs: o [B, HV, V] bf16; state_out (the pool after the
    step, same layout). The evaluator forbids writing inputs, so the updated pool is a separate
    output; every slot is written exactly once (idx is a permutation), by the same access pattern
    (gather and scatter by idx) a serving kernel uses in place."""

    name = "kda_decode"
    shapes = DECODE_TEST
    bench_shapes = DECODE_BENCH
    tolerance = Tolerance(rel_rmse=5e-3)

    def _state_shape(self, shape):
        B, HV = shape["B"], shape["HV"]
        return (B, HV, V, K) if shape["VK"] else (B, HV, K, V)

    def inputs(self, shape):
        B, H, HV = shape["B"], shape["H"], shape["HV"]
        return [TensorSpec("q", (B, H, K), "bf16"), TensorSpec("k", (B, H, K), "bf16"),
                TensorSpec("v", (B, HV, V), "bf16"), TensorSpec("g", (B, HV, K), "bf16"),
                TensorSpec("beta", (B, HV), "bf16"), TensorSpec("A_log", (HV,), "f32"),
                TensorSpec("dt_bias", (HV, K), "f32"), TensorSpec("state", self._state_shape(shape), "f32"),
                TensorSpec("idx", (B,), "i32")]

    def outputs(self, shape):
        B, HV = shape["B"], shape["HV"]
        return [TensorSpec("o", (B, HV, V), "bf16"), TensorSpec("state_out", self._state_shape(shape), "f32")]

    def scalars(self, shape):
        return {n: int(shape[n]) for n in ("B", "H", "HV", "SAFE", "VK")}

    def make_inputs(self, shape, seed: int, rng: Optional[np.random.Generator] = None):
        rng = self.rng_for(seed, rng)
        B, H, HV = shape["B"], shape["H"], shape["HV"]
        x = raw_token_inputs(B, H, HV, rng)
        x["A_log"], x["dt_bias"] = gate_params(HV, rng)
        x["state"] = state_values(self._state_shape(shape), rng)
        x["idx"] = rng.permutation(B).astype(np.int32)
        return x

    def reference(self, inputs, shape):
        o, pool = R.kda_decode(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], inputs["A_log"],
                               inputs["dt_bias"], inputs["state"], inputs["idx"], safe=bool(shape["SAFE"]),
                               layout="vk" if shape["VK"] else "kv")
        return {"o": o, "state_out": pool}

    def flops(self, shape):
        """Per sequence and value head: decay K V, S^T k 2 K V, rank-1 update 2 K V, S^T q 2 K V."""
        return float(shape["B"] * shape["HV"] * 7 * K * V)

    def bytes(self, shape):
        """The state read and written once dominates (1 GiB at B = 256, HV = 32), plus the token inputs."""
        B, H, HV = shape["B"], shape["H"], shape["HV"]
        tok = 2 * (2 * B * H * K + B * HV * V + B * HV * K + B * HV) + 2 * B * HV * V
        return float(tok + 8 * B * HV * K * V + 4 * HV * (1 + K) + 4 * B)


TASK = KdaPrefillTask()
DECODE_TASK = KdaDecodeTask()
