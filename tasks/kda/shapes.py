"""KDA shape sets: the benchmark shapes of the issue and the correctness matrix.

A prefill shape is a dict of integers (the evaluator records and keys shapes by them):
  T total tokens, N sequences, H qk heads, HV value heads (a multiple of H), SAFE (1: lower-bound gate
  with lower_bound = -5, 0: softplus gate), VK (1: states [N, HV, V, K], 0: [N, HV, K, V]), H0 (1: an
  initial state is read; 0: none -- the h0 tensor then holds NaN and must not be read), PACK (0: N
  sequences of T / N tokens; otherwise a key of PACKS). K = V = 128 always.
A decode shape: B sequences (one token each, B state-pool slots), H, HV, SAFE, VK.
"""
from __future__ import annotations

K = V = 128

# Packed variable-length batches (B = 1, cu_seqlens). Keys are stable: records refer to them.
PACKS = {
    1: (1300, 547, 2048, 963, 271, 3063),        # the varlen bench pack (8192 tokens)
    2: (1, 15, 16, 17, 63, 65),                  # short sequences around the 16/64 chunk edges
    3: (65, 1, 130, 17, 64),                     # chunk-edge lengths in another order
    4: (200, 1, 63, 129, 16),
}


def seq_lens(shape: dict) -> tuple[int, ...]:
    """The sequence lengths of a prefill shape (checked against T and N)."""
    T, N, pack = int(shape["T"]), int(shape["N"]), int(shape.get("PACK", 0))
    if pack:
        lens = PACKS[pack]
    else:
        if T % N:
            raise ValueError(f"PACK 0 needs N | T (T={T}, N={N})")
        lens = (T // N,) * N
    if sum(lens) != T or len(lens) != N:
        raise ValueError(f"shape {shape}: pack {pack} has {len(lens)} sequences of {sum(lens)} tokens")
    return lens


def _prefill(T, N, H, HV=None, SAFE=1, VK=1, H0=1, PACK=0):
    return {"T": T, "N": N, "H": H, "HV": HV or H, "SAFE": SAFE, "VK": VK, "H0": H0, "PACK": PACK}


def _both_gates(shapes):
    return [dict(s, SAFE=safe) for s in shapes for safe in (1, 0)]


# The benchmark set: bf16 inputs, fp32 state in and out in the [N, H, V, K] layout the
# anchors were measured with, each for the safe and the softplus gate.
PREFILL_BENCH = _both_gates([
    _prefill(8192, 1, 32), _prefill(8192, 1, 64), _prefill(8192, 1, 96), _prefill(32768, 1, 32),
    _prefill(8192, 6, 64, PACK=1), _prefill(8192, 8, 64), _prefill(8192, 8, 96),
])

# Correctness matrix (host float64 references, token recurrence): both gate forms, both layouts,
# with and without initial state, T not a multiple of 64 (or 16), short sequences in packs, grouped
# value heads. make_inputs adds gates near the bound / very negative gates to every shape.
PREFILL_TEST = [
    _prefill(100, 1, 2, SAFE=0, VK=0, H0=1),
    _prefill(128, 1, 2, SAFE=1, VK=1, H0=0),
    _prefill(177, 6, 2, 4, SAFE=0, VK=1, H0=1, PACK=2),
    _prefill(177, 6, 2, 4, SAFE=1, VK=0, H0=0, PACK=2),
    _prefill(277, 5, 2, 2, SAFE=1, VK=1, H0=1, PACK=3),
    _prefill(409, 5, 1, 2, SAFE=0, VK=0, H0=0, PACK=4),
    _prefill(200, 2, 4, 4, SAFE=0, VK=1, H0=1),
]


def _decode(B, H, HV=None, SAFE=1, VK=1):
    return {"B": B, "H": H, "HV": HV or H, "SAFE": SAFE, "VK": VK}


DECODE_BENCH = _both_gates([_decode(1, 32), _decode(16, 32), _decode(64, 32), _decode(256, 32)])
DECODE_TEST = [_decode(1, 4, SAFE=0, VK=0), _decode(7, 2, 4, SAFE=1, VK=1), _decode(33, 2, 2, SAFE=0, VK=1),
               _decode(16, 4, 8, SAFE=1, VK=0)]
