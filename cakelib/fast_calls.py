"""The repeat-call paths of `knn` and `kmeans` for torch CUDA tensors: a call whose configuration (input
shapes and dtypes, k / iters, metric, out= or not, device, current stream, the loaded dispatch table)
ran before through the general path launches that call's plan (cakelib.launch_plan): attribute reads,
pointer writes and one driver call per kernel. `cakelib.knn` / `cakelib.kmeans` try them, once, before
entering the general entry points (which record the plans).

Each fast function returns None wherever it cannot vouch for the call (no plan, other tensor types, an
out= tensor that is not what the plan writes, an input on another device): the general path then runs
and raises what it raises. The general path records the plan after a successful launch (`record_*`).
"""
from __future__ import annotations

import threading

from .launch_plan import PlannedLaunch, Torch, plan_launch, remember, result_template
from .runtime import _RUNTIMES, table
from .variants import region_table


class KnnPlan:
    # lock: a plan's pointer cells are shared; binding and launching are one step per call (two threads
    # repeating one call on one stream would otherwise launch each other's pointers)
    # table_name: the table the plan's pick came from (the database's region's): one lookup per call
    # i_like, d_like: the results' templates (launch_plan.result_template)
    __slots__ = ("launch", "table", "table_name", "out_shape", "i_like", "d_like", "lock")

    def __init__(self, launch, tbl, table_name, out_shape, device):
        self.launch, self.table, self.table_name, self.out_shape = launch, tbl, table_name, out_shape
        self.i_like = result_template(out_shape, Torch.i32, device)
        self.d_like = result_template(out_shape, Torch.f32, device)
        self.lock = threading.Lock()


class KmeansPlan:
    __slots__ = ("first", "cast", "loop", "table", "c_shape", "a_shape", "c_like", "a_like", "scratch", "lock")

    def __init__(self, first, cast, loop, tbl, c_shape, a_shape, device, scratch):
        self.first, self.cast, self.loop, self.table = first, cast, loop, tbl
        self.c_shape, self.a_shape, self.scratch = c_shape, a_shape, scratch
        self.c_like = result_template(c_shape, Torch.f32, device)
        self.a_like = result_template(a_shape, Torch.i32, device)
        self.lock = threading.Lock()


def _knn_key(queries, database, k, metric, out, stream):
    return ("knn", queries.shape, database.shape, queries.dtype, database.dtype, k, metric, out is None, stream)


def _kmeans_key(x, init, k, iters, out, stream):
    return ("kmeans", x.shape, x.dtype, init.shape, init.dtype, k, iters, out is None, stream)


def _knn_table(database):
    """The dispatch table in force for this database and its name (its region's, else kNN's own:
    runtime.choose)."""
    name = region_table("knn", {"M": database.shape[0]})
    tbl = table(name)
    return (tbl, name) if tbl is not None else (table("knn"), "knn")


def _f16(t):
    """The fp16 contiguous tensor a kernel reads (arrays.as_input's conversion; `t` itself when it is)."""
    return t if t.dtype is Torch.f16 and t.is_contiguous() else t.to(Torch.f16).contiguous()


def _output_ok(t, shape, dtype, dev) -> bool:
    """arrays.as_output's checks: a contiguous CUDA tensor of this shape and dtype on the inputs' device."""
    return (type(t) is Torch.tensor and t.shape == shape and t.dtype is dtype and t.is_contiguous()
            and t.get_device() == dev)


def knn(queries, database, k, metric, out):
    """The planned call, or None (the general path runs)."""
    T = Torch.tensor
    if T is None or type(queries) is not T or type(database) is not T:
        return None
    dev = queries.get_device()
    rt = _RUNTIMES.get(dev)
    if rt is None:
        return None
    plan = rt.plans.get(_knn_key(queries, database, k, metric, out, Torch.raw_stream(dev)))
    # (the key holds the database's shape, so its region, and table_name, are the plan's)
    if plan is None or plan.launch is None or table(plan.table_name) is not plan.table or database.get_device() != dev:
        return None
    shape = plan.out_shape
    if out is not None:
        I, Dist = out[0], out[1]
        if not (_output_ok(I, shape, Torch.i32, dev) and _output_ok(Dist, shape, Torch.f32, dev)):
            return None
    else:
        I, Dist = Torch.empty_like(plan.i_like), Torch.empty_like(plan.d_like)
    q, db = _f16(queries), _f16(database)
    ptrs = (q.data_ptr(), db.data_ptr(), I.data_ptr(), Dist.data_ptr())
    with plan.lock:   # (run makes the plan's context current)
        plan.launch.run(ptrs)
    return I, Dist


def record_knn(rt, queries, database, k, metric, out, kern, tensors: dict, scalars: dict, stream: int) -> None:
    """After a general-path search of torch tensors (variant and device chosen by the library, no rerank):
    keep its plan, unless one for the loaded table is kept already."""
    Torch.load()
    if type(queries) is not Torch.tensor or type(database) is not Torch.tensor:
        return
    key = _knn_key(queries, database, k, metric, out, stream)
    tbl, name = _knn_table(database)
    old = rt.plans.get(key)
    if old is not None and old.table is tbl:
        return
    launch = plan_launch(rt, kern, tensors, scalars, stream, ("Xq", "Xb", "I", "Dist"))
    remember(rt, key, KnnPlan(launch, tbl, name, (int(queries.shape[0]), int(k)), queries.device))


def kmeans(x, k, iters, init, out):
    """The planned call (`init` given), or None (the general path runs)."""
    T = Torch.tensor
    if T is None or type(x) is not T or type(init) is not T:
        return None
    dev = x.get_device()
    rt = _RUNTIMES.get(dev)
    if rt is None:
        return None
    plan = rt.plans.get(_kmeans_key(x, init, k, iters, out, Torch.raw_stream(dev)))
    if plan is None or plan.first is None or plan.table is not table("kmeans") or init.get_device() != dev:
        return None
    if out is not None:
        C, A = out[0], out[1]
        if not (_output_ok(C, plan.c_shape, Torch.f32, dev) and _output_ok(A, plan.a_shape, Torch.i32, dev)):
            return None
    else:
        C, A = Torch.empty_like(plan.c_like), Torch.empty_like(plan.a_like)
    xs, c0 = _f16(x), _f16(init)
    ptrs = (xs.data_ptr(), c0.data_ptr(), A.data_ptr(), C.data_ptr())
    with plan.lock:
        _run_lloyd(plan, *ptrs, iters)
    return C, A


def _run_lloyd(plan: KmeansPlan, x: int, c0: int, a: int, cn: int, iters: int) -> None:
    """The general path's launch order: lloyd(C = init), then (cast Cnew -> C16, lloyd(C = C16)) per
    further iteration (the first run makes the context current for the fires after it)."""
    plan.first.run((x, c0, a, cn))
    if iters > 1:
        plan.cast.bind((cn,))
        plan.loop.bind((x, a, cn))
        for _ in range(iters - 1):
            plan.cast.fire()
            plan.loop.fire()


def record_kmeans(rt, x, init, k, iters, out, lloyd, cast, launches: dict, stream: int) -> None:
    """After a general-path k-means of torch tensors with `init` given (variant and device chosen by the
    library): keep its plan. `launches`: the general path's arguments, "first" / "loop" (lloyd's tensors,
    scalars) and "cast" (tensors, scalars; absent when iters = 1), and "scratch" (the fp16 centroids the
    loop reads, kept by the plan), "c_shape" / "a_shape" (the results' shapes)."""
    Torch.load()
    if type(x) is not Torch.tensor or type(init) is not Torch.tensor:
        return
    key = _kmeans_key(x, init, k, iters, out, stream)
    tbl = table("kmeans")
    old = rt.plans.get(key)
    if old is not None and old.table is tbl:
        return
    first = plan_launch(rt, lloyd, *launches["first"], stream, ("X", "C", "A", "Cnew"))
    loop = castp = None
    if iters > 1:
        loop = plan_launch(rt, lloyd, *launches["loop"], stream, ("X", "A", "Cnew"))
        castp = plan_launch(rt, cast, *launches["cast"], stream, ("Src",))
        if loop is None or castp is None:
            first = None
    remember(rt, key, KmeansPlan(first, castp, loop, tbl, tuple(launches["c_shape"]), tuple(launches["a_shape"]),
                                 x.device, launches.get("scratch")))


__all__ = ["knn", "kmeans", "record_knn", "record_kmeans", "PlannedLaunch"]
