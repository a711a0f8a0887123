"""A Python builder for CAKE IR, for people writing seed programs and tactics.

    kb = KernelBuilder("copy", arch="sm_90a", grid=["M / 4"], threads=128)
    x = kb.tensor("X", "f32", ["M", "N"])
    with kb.role("main", warps=(0, 4)) as r:
        with r.for_("i", 0, 4):
            r.map("acc", "acc * 2")
    kernel = kb.build()          # a validated cake_ir.nodes.Kernel

Statements are appended to the innermost open block (role body, loop body, if branch).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Optional, Sequence, Union

from . import nodes as N


def tile(buf: str, offset: Optional[Sequence] = None, shape: Optional[Sequence[int]] = None, slot=None) -> dict:
    t: dict[str, Any] = {"buf": buf}
    if slot is not None:
        t["slot"] = slot
    if offset is not None:
        t["offset"] = list(offset)
    if shape is not None:
        t["shape"] = list(shape)
    return t


def bar(name: str, index: Union[int, str] = 0) -> dict:
    return {"name": name, "index": index}


class _Body:
    """Appends statement dicts to the innermost open list."""

    def __init__(self, root: list):
        self._stack: list[list] = [root]

    def add(self, op: str, **fields) -> dict:
        st = {"op": op, **{k: v for k, v in fields.items() if v is not None}}
        if "else_" in st:
            st["else"] = st.pop("else_")
        self._stack[-1].append(st)
        return st

    @contextmanager
    def _nest(self, lst: list):
        self._stack.append(lst)
        try:
            yield self
        finally:
            self._stack.pop()

    # ---- control
    @contextmanager
    def for_(self, var: str, start, stop, step: int = 1, unroll: Union[bool, int] = False, id: str | None = None):
        st = self.add("for", var=var, start=start, stop=stop, step=step if step != 1 else None,
                      unroll=unroll if unroll else None, id=id, body=[])
        with self._nest(st["body"]):
            yield self

    @contextmanager
    def if_(self, cond, id: str | None = None):
        st = self.add("if", cond=cond, then=[], id=id)
        with self._nest(st["then"]):
            yield self

    @contextmanager
    def else_(self):
        """The else branch of the if_ block just closed in the same body (not of an if nested in it)."""
        cur = self._stack[-1]
        st = cur[-1] if cur else None
        if st is None or st.get("op") != "if" or "else" in st:
            raise ValueError("else_() must directly follow an if_() block in the same body")
        st["else"] = []
        with self._nest(st["else"]):
            yield self

    def let(self, name: str, value):
        return self.add("let", name=name, value=value)

    # ---- memory
    def copy(self, kind: str, src: dict, dst: dict, barrier: dict | None = None, vec_bytes: int | None = None,
             scope: str | None = None, oob: str | None = None, id: str | None = None, multicast: bool | None = None):
        return self.add("copy", kind=kind, src=src, dst=dst, barrier=barrier, vec_bytes=vec_bytes, scope=scope,
                        oob=oob, id=id, multicast=multicast or None)

    def access(self, op: str, src: dict, dst: dict, vec_bytes: int | None = None, trans: bool | None = None,
               oob: str | None = None, row_limit=None, id: str | None = None):
        return self.add(op, src=src, dst=dst, vec_bytes=vec_bytes, trans=trans, oob=oob, row_limit=row_limit, id=id)

    def ldg(self, src, dst, **kw):
        return self.access("ldg", src, dst, **kw)

    def stg(self, src, dst, **kw):
        return self.access("stg", src, dst, **kw)

    def lds(self, src, dst, **kw):
        return self.access("lds", src, dst, **kw)

    def sts(self, src, dst, **kw):
        return self.access("sts", src, dst, **kw)

    def ldmatrix(self, src, dst, **kw):
        return self.access("ldmatrix", src, dst, **kw)

    # ---- compute
    def mma_sync(self, a, b, c, shape=(16, 8, 16), id: str | None = None):
        return self.add("mma_sync", a=a, b=b, c=c, shape=list(shape) if tuple(shape) != (16, 8, 16) else None, id=id)

    def wgmma(self, shape, a, b, acc, accumulate=True, id: str | None = None, b_major: str = "k",
              b_atom_rows: int | None = None):
        return self.add("wgmma", shape=list(shape), a=a, b=b, acc=acc,
                        accumulate=None if accumulate is True else accumulate, id=id,
                        b_major=None if b_major == "k" else b_major, b_atom_rows=b_atom_rows)

    def fill(self, dst, value: float = 0.0):
        return self.add("fill", dst=dst if isinstance(dst, dict) else tile(dst), value=value)

    def map(self, dst, expr, id: str | None = None):
        return self.add("map", dst=dst if isinstance(dst, dict) else tile(dst), expr=expr, id=id)

    def reduce(self, kind: str, src, dst, axis: int = 1, id: str | None = None, scope: str | None = None,
               accumulate: bool = False):
        return self.add("reduce", kind=kind, src=src if isinstance(src, dict) else tile(src),
                        dst=dst if isinstance(dst, dict) else tile(dst), axis=axis, id=id, scope=scope,
                        accumulate=accumulate or None)

    def row_select(self, kind: str, k: int, src: dict, count, vals: dict, idx: dict, scratch: dict, **opt):
        """The k best of a row segment by the whole CTA (nodes.RowSelect; opt: src_idx, col, scale, row_bias,
        col_bias, id)."""
        return self.add("row_select", kind=kind, k=k, src=src, count=count, vals=vals, idx=idx, scratch=scratch,
                        **opt)

    def scan(self, kind: str, src, dst, axis: int = 1, exclusive: bool = False):
        return self.add("scan", kind=kind, src=src if isinstance(src, dict) else tile(src),
                        dst=dst if isinstance(dst, dict) else tile(dst), axis=axis, exclusive=exclusive or None)

    # ---- sync
    def mbar_init(self, barrier: dict, arrivals: int):
        return self.add("mbar_init", barrier=barrier, arrivals=arrivals)

    def mbar_arrive(self, barrier: dict):
        return self.add("mbar_arrive", barrier=barrier)

    def mbar_expect_tx(self, barrier: dict, nbytes: int):
        return self.add("mbar_expect_tx", barrier=barrier, bytes=nbytes)

    def mbar_wait(self, barrier: dict, parity):
        return self.add("mbar_wait", barrier=barrier, parity=parity)

    def sync(self, op: str, n: int | None = None, barrier: str | None = None):
        return self.add(op, n=n, barrier=barrier)

    def fence(self, kind: str):
        return self.add("fence", kind=kind)

    def pipe(self, op: str, pipe: str, it, id: str | None = None):
        return self.add(f"pipe_{op}", pipe=pipe, iter=it, id=id)


class RoleBuilder(_Body):
    def __init__(self, doc: dict):
        super().__init__(doc["body"])
        self.doc = doc


IDENT_MAX = 48   # cake_ir.nodes' identifier limit


def fit_ident(name: str) -> str:
    """A generated kernel name that may run past the IR's identifier limit (a variant's tags add up): kept
    when it fits, else its first characters and 8 hex digits of a hash of the whole, so distinct names stay
    distinct and deterministic."""
    if len(name) <= IDENT_MAX:
        return name
    import hashlib
    return name[:IDENT_MAX - 9] + "_" + hashlib.sha1(name.encode()).hexdigest()[:8]


class KernelBuilder:
    def __init__(self, name: str, arch: str, grid: Sequence, threads: int, min_blocks_per_sm: int = 1,
                 cluster: Optional[Sequence[int]] = None, note: str | None = None):
        launch: dict[str, Any] = {"grid": list(grid), "threads": threads}
        if min_blocks_per_sm != 1:
            launch["min_blocks_per_sm"] = min_blocks_per_sm
        if cluster:
            launch["cluster"] = list(cluster)
        self.doc: dict[str, Any] = {"name": name, "arch": arch, "launch": launch, "consts": {}, "params": [],
                                    "buffers": [], "barriers": [], "pipelines": [], "prologue": [], "roles": []}
        if note:
            self.doc["note"] = note
        self.prologue = _Body(self.doc["prologue"])

    def const(self, **values: int) -> None:
        self.doc["consts"].update(values)

    def tensor(self, name: str, dtype: str, shape: Sequence, access: str = "read", tma: dict | None = None,
               align: int | None = None, strides: Sequence | None = None) -> str:
        p: dict[str, Any] = {"kind": "tensor", "name": name, "dtype": dtype, "shape": list(shape)}
        if access != "read":
            p["access"] = access
        if tma is not None:
            p["tma"] = tma
        if align is not None:
            p["align"] = align
        if strides is not None:
            p["strides"] = list(strides)
        self.doc["params"].append(p)
        return name

    def scalar(self, name: str, dtype: str = "i32", min: int | None = None, max: int | None = None,
               divisible_by: int | None = None) -> str:
        p: dict[str, Any] = {"kind": "scalar", "name": name, "dtype": dtype}
        for k, v in (("min", min), ("max", max), ("divisible_by", divisible_by)):
            if v is not None:
                p[k] = v
        self.doc["params"].append(p)
        return name

    def buffer(self, name: str, space: str, dtype: str, shape: Sequence[int], layout: str = "row_major",
               stages: int = 1, scope: str | None = None, vec: int | None = None, pad: int | None = None,
               role: str | None = None) -> str:
        b: dict[str, Any] = {"name": name, "space": space, "dtype": dtype, "shape": list(shape)}
        if layout != "row_major":
            b["layout"] = layout
        for k, v in (("stages", stages if stages != 1 else None), ("scope", scope), ("vec", vec), ("pad", pad),
                     ("role", role)):
            if v is not None:
                b[k] = v
        self.doc["buffers"].append(b)
        return name

    def mbarrier(self, name: str, arrivals: int, count: int = 1) -> str:
        self.doc["barriers"].append({"kind": "mbarrier", "name": name, "count": count, "arrivals": arrivals})
        return name

    def named_barrier(self, name: str, bar_id: int, threads: int) -> str:
        self.doc["barriers"].append({"kind": "named", "name": name, "bar_id": bar_id, "threads": threads})
        return name

    def pipeline(self, name: str, stages: int, mechanism: str, producer: str, consumers: Sequence[str],
                 buffers: Sequence[str], cluster: bool = False) -> str:
        self.doc["pipelines"].append({"name": name, "stages": stages, "mechanism": mechanism, "producer": producer,
                                      "consumers": list(consumers), "buffers": list(buffers),
                                      **({"cluster": True} if cluster else {})})
        return name

    @contextmanager
    def role(self, name: str, warps: tuple[int, int], regs: int | None = None):
        doc: dict[str, Any] = {"name": name, "warps": list(warps), "body": []}
        if regs is not None:
            doc["regs"] = regs
        self.doc["roles"].append(doc)
        yield RoleBuilder(doc)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.doc.items() if v not in ({}, []) or k in ("roles",)}

    def build(self) -> N.Kernel:
        return N.Kernel.model_validate(self.to_dict())
