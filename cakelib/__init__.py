"""CAKE's kernel library: operations users call from their own code (`knn`, `kmeans`), each dispatching
per shape to a compiled CAKE IR variant (cakelib/tables/<op>.json, fitted from H200 measurements by
bench/lib_grid.py), with a general fallback. Heavy modules load on first call.

    from cakelib import knn, kmeans
    idx, dist = knn(queries, database, k=10)          # torch CUDA tensors, cupy arrays or numpy
    centroids, assign = kmeans(x, k=256, iters=10)
    o, states = kda_prefill(q, k, v, g, beta, A_log, dt_bias, cu_seqlens=cu)   # torch CUDA tensors
    o, pool = kda_decode(q1, k1, v1, g1, beta1, A_log, dt_bias, pool, idx, inplace=True)   # rows idx updated

Domains (docs/library.md): knn any D <= 1024, k <= 1024 (k > 32: M <= 2^22); kmeans D = 128 with K <= 256
on the fitted table, else D a multiple of 32 in [32, 1024] with K <= 65536. A repeat call at a configuration
seen before launches its cached plan (cakelib/fast_calls.py).

Calls on one device share cached workspaces: issue them from one stream at a time.
"""


def knn(queries, database, k=10, metric="l2", *, out=None, **options):
    """cakelib.knn_search.knn. A repeat call at a configuration seen before launches its plan here
    (cakelib.fast_calls; a small call's host time is microseconds, a Python frame ~0.3): every call without
    a variant, a device or rerank."""
    fast = _FAST.get("knn")
    if fast is not None and (not options or _defaults_only(options, _KNN_DEFAULTS)):
        hit = fast(queries, database, k, metric, out)
        if hit is not None:
            return hit
    return (_OPS.get("knn") or _load("knn_search", "knn"))(queries, database, k, metric, out=out, **options)


def kmeans(x, k, iters=10, *, init=None, out=None, **options):
    """cakelib.kmeans_lloyd.kmeans, the plan first as in `knn`: every call with `init`, without a variant or a
    device (a seed picks only the initial centroids, which `init` gives)."""
    fast = _FAST.get("kmeans")
    if fast is not None and init is not None and (not options or _defaults_only(options, _KMEANS_DEFAULTS)) \
            and iters >= 1:
        hit = fast(x, k, iters, init, out)
        if hit is not None:
            return hit
    return (_OPS.get("kmeans") or _load("kmeans_lloyd", "kmeans"))(x, k, iters, init=init, out=out, **options)


# the options a planned call may carry, at the values it may carry them (None: any value)
_KNN_DEFAULTS = {"variant": (None,), "device": (None,), "rerank": (False,)}
_KMEANS_DEFAULTS = {"variant": (None,), "device": (None,), "seed": None}


def _defaults_only(options: dict, allowed: dict) -> bool:
    """Every option is one a planned call may carry, at a value it may carry (an unknown name goes to the
    general entry, which refuses it)."""
    return all(n in allowed and (allowed[n] is None or any(v is a for a in allowed[n])) for n, v in options.items())


_OPS: dict = {}    # loaded entry points (an import statement costs ~0.5 us a call)
_FAST: dict = {}   # cakelib.fast_calls' planned calls, once an entry point has loaded


def _load(module: str, name: str):
    import importlib
    from . import fast_calls
    fn = _OPS[name] = getattr(importlib.import_module(f".{module}", __name__), name)
    _FAST[name] = getattr(fast_calls, name)
    return fn


def kda_prefill(*args, **kwargs):
    from .kda_attention import kda_prefill as _f
    return _f(*args, **kwargs)


def kda_decode(*args, **kwargs):
    from .kda_attention import kda_decode as _f
    return _f(*args, **kwargs)


__all__ = ["knn", "kmeans", "kda_prefill", "kda_decode"]
