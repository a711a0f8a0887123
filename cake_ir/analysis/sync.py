"""Synchronisation analysis shared by the E-SYN-* and E-PIP-* rules.

Three layers, cheapest first:

1. **Who executes a statement** (`KernelSync.mask`): a boolean mask over the threads of the role (or
   of the CTA, for the prologue) from the enclosing `if` guards. Guard conditions are split into
   atoms; atoms over thread builtins (`tid lane warp role_warp role_tid wg wg_tid`, lets derived from
   them, `elect_one()`) are evaluated per thread with numpy, atoms over loop variables / params
   ("uniform" atoms: every thread agrees) select *instances*, not threads, and are treated as
   don't-care. `elect_one()` picks the lowest active lane of each warp among the threads that reach
   it (so `role_warp == 0 && elect_one()` is one thread). Unknown (data-dependent) masks are None.

2. **Symbolic keys** (`norm_index`, `phase_loop`): barrier index / slot expressions with lets inlined
   and loop variables renamed by nesting depth (`L0`, `L1`, ...), so a producer's `kt % S` and a
   consumer's `k % S` compare equal with `expr.canon`. Used to group arrivals per phase and to match
   expect-tx bytes with the TMA copies of the same phase.

3. **Protocol simulation** (`KernelSync.sim()`, class `Simulator`): every role (and the prologue) is
   interpreted as a process over the expanded kernel with sampled sizes (integer params get values
   that make the param-dependent loops run >= stages+3 iterations, so every stage is reused; block
   index 0). mbarriers (phase, pending arrivals, tx-count), named barriers/__syncthreads, cp.async / wgmma / TMA-store groups are modelled
   exactly; waits block until the phase they test completes (parity semantics of
   `mbarrier.try_wait.parity`). Roles run round-robin, each until it blocks; if none can progress the
   run is a deadlock. Every executed statement becomes a node of a happens-before DAG:
   program-order edges per *thread class* (the partition of the role's threads induced by the guard
   masks, so `if role_tid == 0` code is not ordered with the other threads), plus barrier edges
   (arrivals and TMA complete_tx -> phase node -> every wait that observes the phase; bar.sync
   arrivals -> completion -> waiters). Asynchronous operations are intervals [issue, completion]:
   the completion node hangs off the issue and is only reachable through the mechanism that tracks
   it (mbarrier complete_tx, cp.async.wait_group / cp.async.mbarrier.arrive, wgmma.wait_group,
   cp.async.bulk.wait_group.read). Each smem access records buffer, concrete slot(s), per-warp element
   region, read/write, proxy and interval. Ancestor sets are bitsets (Python ints), with two extra
   families: `cross` (reached through a CTA-level collective: bar.sync or an mbarrier phase -- needed
   when different threads write and read) and `fenced` (through a `fence.proxy.async`).
   `SimResult.issues` lists the findings per rule code; see `_analyse`.

Everything is best effort and never raises: when a kernel cannot be simulated (unknown names,
thread-dependent loop bounds, too many steps) the simulation is skipped and its rules stay silent.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np

from .. import expr as E
from ..dtypes import SIZE
from ..nodes import (Access, Block, BucketOffsets, BucketPlace, LastCta, OneHot, RedAdd, RowSelect, ScatterAdd, SegmentSums, TopK, TopKBound, TopKMerge, Copy, Fence, Fill, For, If, Kernel, Let, Map, MBarrier, MbarArrive,
                     MbarExpectTx, MbarInit, MbarWait, CpAsyncArrive, NamedBarSync, NamedBarrier, PipeOp,
                     Reduce, Scan, ScalarParam, SimpleSync, TensorParam, TileRef, WaitGroup, Wgmma, MmaSync)
from ..walk import Site, statements
from .tiles import bulk_rows, threads_in_scope

THREAD_NAMES = frozenset({"tid", "lane", "warp", "role_warp", "role_tid", "wg", "wg_tid"})
STRICT = bool(os.environ.get("CAKE_STRICT"))  # tests of this module re-raise internal errors


class Unknown(Exception):
    """A value the analysis cannot determine statically."""


# ------------------------------------------------------------------------------- expressions
def subst_lets(node: E.Node, lets) -> E.Node:
    """Inline `let`s (outermost first in `lets`) into an expression."""
    for let in reversed(tuple(lets)):
        if let.name in E.free_vars(node):
            try:
                node = E.substitute(node, {let.name: E.parse_index(let.value)})
            except E.ExprError:
                pass
    return node


def is_thread_dep(node: E.Node) -> bool:
    for n in E.walk(node):
        if isinstance(n, E.Var) and n.name in THREAD_NAMES:
            return True
        if isinstance(n, E.Call) and n.fn == "elect_one":
            return True
    return False


def ld_representative(node: E.Node) -> E.Node:
    """Replace CTA-uniform run-time reads ld(T, i, lo, hi[, est]) by est or lo: one representative
    value for the whole CTA is what the simulator needs (every thread sees the same slot); a
    thread-dependent ld stays and the simulation of the role gives up on it."""
    if isinstance(node, E.Call):
        if node.fn == "ld" and not any(is_thread_dep(a) for a in node.args):
            return E.ld_estimate(node)
        return E.Call(node.fn, tuple(ld_representative(a) for a in node.args))
    if isinstance(node, E.Un):
        return E.Un(node.op, ld_representative(node.a))
    if isinstance(node, E.Bin):
        return E.Bin(node.op, ld_representative(node.a), ld_representative(node.b))
    return node


def parse_i(text) -> Optional[E.Node]:
    try:
        return E.parse_index(text)
    except (E.ExprError, TypeError):
        return None


def parse_c(text) -> Optional[E.Node]:
    try:
        return E.parse_cond(text)
    except (E.ExprError, TypeError):
        return None


def norm_index(site: Site, text, consts: Optional[dict] = None) -> Optional[E.Node]:
    """The expression with lets and consts inlined and loop variables renamed L0 (outermost), L1, ..."""
    node = parse_i(text)
    if node is None:
        return None
    node = subst_lets(node, site.lets)
    mapping = {n: E.Num(v) for n, v in (consts or {}).items()}
    for d, loop in enumerate(site.loops):
        mapping[loop.var] = E.Var(f"L{d}")
    return E.substitute(node, mapping)


def inline(site: Site, text, consts: Optional[dict] = None) -> Optional[E.Node]:
    """The expression with lets and consts inlined (loop variables kept)."""
    node = parse_i(text)
    if node is None:
        return None
    node = subst_lets(node, site.lets)
    if consts:
        node = E.substitute(node, {n: E.Num(v) for n, v in consts.items()})
    return node


def key_of(node: Optional[E.Node]) -> Optional[str]:
    if node is None:
        return None
    c = E.canon(node)
    return c if c is not None else E.to_text(node)


def text(node: E.Node) -> str:
    return E.to_text(node)


_PY_OPS = {"+": "+", "-": "-", "*": "*", "/": "//", "%": "%", "<": "<", "<=": "<=", ">": ">", ">=": ">=",
           "==": "==", "!=": "!="}


def _py(node) -> str:
    if isinstance(node, E.Num):
        if isinstance(node.value, float):
            raise Unknown("float")
        return f"({node.value})"
    if isinstance(node, E.Var):
        return f"e[{node.name!r}]"
    if isinstance(node, E.Un):
        return f"(-{_py(node.a)})" if node.op == "-" else f"(0 if {_py(node.a)} else 1)"
    if isinstance(node, E.Call):
        args = [_py(a) for a in node.args]
        if node.fn in ("min", "max"):
            return f"{node.fn}({args[0]}, {args[1]})"
        if node.fn == "cdiv":
            return f"(-((-{args[0]}) // {args[1]}))"
        raise Unknown(node.fn)
    a, b = _py(node.a), _py(node.b)
    if node.op == "&&":
        return f"(1 if ({a} and {b}) else 0)"
    if node.op == "||":
        return f"(1 if ({a} or {b}) else 0)"
    op = _PY_OPS[node.op]
    if op in ("<", "<=", ">", ">=", "==", "!="):
        return f"(1 if {a} {op} {b} else 0)"
    return f"({a} {op} {b})"


_FN_CACHE: dict = {}


def compile_index(node):
    """A fast evaluator `f(env) -> int` for a thread-independent expression (floor / and %)."""
    fn = _FN_CACHE.get(node)
    if fn is None:
        try:
            fn = eval(f"lambda e: {_py(node)}", {"min": min, "max": max})  # noqa: S307 - generated from our AST
        except (Unknown, SyntaxError, RecursionError):
            fn = False
        if len(_FN_CACHE) < 20000:
            _FN_CACHE[node] = fn
    return fn


def _truth(v, n):
    if isinstance(v, np.ndarray):
        return v != 0 if v.dtype != bool else v
    return np.full(n, bool(v))


# ------------------------------------------------------------------------------ thread spaces
class ThreadSpace:
    """The threads of a role (or of the CTA for the prologue) and their builtin index values."""

    def __init__(self, kernel: Kernel, role, role_index):
        self.role = role
        self.role_index = role_index
        if role is None:
            n = kernel.launch.threads
            first = 0
        else:
            n = role.threads
            first = role.first_warp
        self.n = n
        loc = np.arange(n)
        tid = first * 32 + loc
        self.gwarp = tid // 32
        if role is None:
            self.arr = {"tid": tid, "lane": tid % 32, "warp": tid // 32, "role_warp": tid // 32,
                        "role_tid": tid, "wg": tid // 128, "wg_tid": tid % 128}
        else:
            self.arr = {"tid": tid, "lane": tid % 32, "warp": tid // 32, "role_warp": loc // 32,
                        "role_tid": loc, "wg": loc // 128, "wg_tid": loc % 128}
        self.all = np.ones(n, dtype=bool)
        self.none = np.zeros(n, dtype=bool)
        self.tid = tid
        self.first = first
        self.full = (1 << n) - 1
        self._arr_cache: dict = {}
        self._nbytes = (n + 7) // 8

    # bitset masks (the simulator's representation): bit i = i-th thread of the space
    def to_int(self, arr) -> int:
        return int.from_bytes(np.packbits(arr, bitorder="little").tobytes(), "little")

    def to_arr(self, m: int):
        a = self._arr_cache.get(m)
        if a is None:
            raw = np.frombuffer(m.to_bytes(self._nbytes, "little"), dtype=np.uint8)
            a = np.unpackbits(raw, bitorder="little")[: self.n].astype(bool)
            if len(self._arr_cache) < 4096:
                self._arr_cache[m] = a
        return a

    def warps_int(self, m: int) -> int:
        c = 0
        while m:
            if m & 0xFFFFFFFF:
                c += 1
            m >>= 32
        return c

    def single_tid(self, m: int) -> Optional[int]:
        if m and m & (m - 1) == 0:
            return self.first * 32 + m.bit_length() - 1
        return None

    def name(self) -> str:
        return f"role {self.role.name!r}" if self.role is not None else "the prologue"

    def warps_of(self, mask) -> int:
        return int(len(np.unique(self.gwarp[mask]))) if mask.any() else 0

    def describe(self, mask) -> str:
        c = int(mask.sum())
        if c == self.n:
            return f"all {c} threads of {self.name()}"
        if c == 1:
            return f"1 thread (tid {int(self.tid[mask][0])})"
        w = self.warps_of(mask)
        if c == w:
            return f"{c} threads (one lane in each of {w} warps)"
        return f"{c} threads"


def _elect(ctx, sp: ThreadSpace):
    out = np.zeros(sp.n, dtype=bool)
    idx = np.flatnonzero(ctx)
    if idx.size:
        _, first = np.unique(sp.gwarp[idx], return_index=True)
        out[idx[first]] = True
    return out


def _ev(node, env, sp: ThreadSpace, ctx):
    """Evaluate an integer/cond expression; names map to ints or per-thread numpy arrays."""
    if isinstance(node, E.Num):
        if isinstance(node.value, float):
            raise Unknown("float")
        return node.value
    if isinstance(node, E.Var):
        v = env.get(node.name)
        if v is None:
            raise Unknown(node.name)
        return v
    if isinstance(node, E.Un):
        a = _ev(node.a, env, sp, ctx)
        if node.op == "-":
            return -a
        return np.logical_not(a) if isinstance(a, np.ndarray) else int(not a)
    if isinstance(node, E.Call):
        if node.fn == "elect_one":
            return _elect(ctx, sp)
        args = [_ev(x, env, sp, ctx) for x in node.args]
        if node.fn == "min":
            return np.minimum(*args) if any(isinstance(a, np.ndarray) for a in args) else min(args)
        if node.fn == "max":
            return np.maximum(*args) if any(isinstance(a, np.ndarray) for a in args) else max(args)
        if node.fn == "cdiv":
            a, b = args
            if np.any(np.asarray(b) == 0):
                raise Unknown("div0")
            return -((-a) // b)
        raise Unknown(node.fn)
    op = node.op
    if op == "&&":
        a = _truth(_ev(node.a, env, sp, ctx), sp.n)
        b = _truth(_ev(node.b, env, sp, ctx & a), sp.n)
        return a & b
    if op == "||":
        a = _truth(_ev(node.a, env, sp, ctx), sp.n)
        b = _truth(_ev(node.b, env, sp, ctx & ~a), sp.n)
        return a | b
    a = _ev(node.a, env, sp, ctx)
    b = _ev(node.b, env, sp, ctx)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op in ("/", "%"):
        if np.any(np.asarray(b) == 0):
            raise Unknown("div0")
        return a // b if op == "/" else a % b
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    if op == ">=":
        return a >= b
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    raise Unknown(op)


def _cond(node, env, sp: ThreadSpace, ctx, uni):
    """Per-thread truth of a condition; uniform atoms whose names are not in env take `uni`."""
    if isinstance(node, E.Bin) and node.op in ("&&", "||"):
        a = _cond(node.a, env, sp, ctx, uni)
        if node.op == "&&":
            return a & _cond(node.b, env, sp, ctx & a, uni)
        return a | _cond(node.b, env, sp, ctx & ~a, uni)
    if isinstance(node, E.Un) and node.op == "!":
        return ~_cond(node.a, env, sp, ctx, uni)
    if not is_thread_dep(node):
        fv = E.free_vars(node)
        if all(v in env for v in fv):
            try:
                return np.full(sp.n, bool(E.evaluate(node, {v: env[v] for v in fv})))
            except (E.ExprError, ZeroDivisionError, TypeError):
                pass
        if uni is None:
            raise Unknown("uniform")
        return np.full(sp.n, bool(uni))
    return _truth(_ev(node, env, sp, ctx), sp.n)


# ------------------------------------------------------------------------- static per-kernel info
class KernelSync:
    """Static facts about one kernel (cached per kernel object, see `get`)."""

    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.sites: list[Site] = list(statements(kernel))
        self.by_path = {s.path: s for s in self.sites}
        self.order = {s.path: i for i, s in enumerate(self.sites)}
        self._spaces: dict = {}
        self._masks: dict = {}
        self.consts = dict(kernel.consts)
        self._sim = None
        self._sim_done = False
        self.skipped: Optional[tuple[str, Optional[str]]] = None   # (why, path) when sim() gave up

    def space(self, role_index) -> ThreadSpace:
        sp = self._spaces.get(role_index)
        if sp is None:
            role = self.k.roles[role_index] if role_index is not None else None
            sp = self._spaces[role_index] = ThreadSpace(self.k, role, role_index)
        return sp

    def mask(self, site: Site):
        """Threads executing `site` (numpy bool over the role's threads), or None when unknown."""
        if site.path in self._masks:
            return self._masks[site.path]
        try:
            m = self._mask(site)
        except (Unknown, E.ExprError, ValueError, TypeError, OverflowError):
            m = None
        self._masks[site.path] = m
        return m

    def _mask(self, site: Site):
        sp = self.space(site.role_index)
        mask = sp.all
        env = dict(self.consts)
        env.update(sp.arr)
        for g in site.guards:
            node = parse_c(g.cond)
            if node is None:
                return None
            node = subst_lets(node, site.lets)
            if not is_thread_dep(node):
                continue
            cands = []
            for uni in (True, False):
                try:
                    m = _cond(node, env, sp, mask, uni)
                except Unknown:
                    return None
                m = mask & (m if g.taken else ~m)
                if m.any() and not any(np.array_equal(m, c) for c in cands):
                    cands.append(m)
            if not cands:
                mask = sp.none
            elif len(cands) == 1:
                mask = cands[0]
            else:
                return None
        return mask

    def max_sharing(self, site: Site, exprs) -> Optional[int]:
        """Among the threads executing `site`, the largest number that agree on the values of `exprs`
        (index expressions; uniform names other than consts are held fixed). 1 means every executing
        thread issues a distinct operation (e.g. one TMA store per warpgroup at offset `64 * wg`)."""
        m = self.mask(site)
        if m is None:
            return None
        if not m.any():
            return 0
        sp = self.space(site.role_index)
        cols = []
        for e in exprs:
            node = parse_i(e)
            if node is None:
                return None
            node = subst_lets(node, site.lets)
            if not is_thread_dep(node):
                continue
            env = {v: 0 for v in E.free_vars(node)}
            env.update(self.consts)
            for loop in site.loops:
                v = E.try_const(parse_i(loop.start) or E.Num(0), self.consts)
                env[loop.var] = v if isinstance(v, int) else 0
            env.update(sp.arr)
            try:
                v = _ev(node, env, sp, m)
            except Unknown:
                return None
            cols.append(np.broadcast_to(np.asarray(v), (sp.n,))[m])
        if not cols:
            return int(m.sum())
        _, counts = np.unique(np.stack(cols, axis=1), axis=0, return_counts=True)
        return int(counts.max())

    def count(self, site: Site) -> Optional[int]:
        m = self.mask(site)
        return None if m is None else int(m.sum())

    def thread_guards(self, site: Site) -> list[str]:
        out = []
        for g in site.guards:
            node = parse_c(g.cond)
            if node is not None and is_thread_dep(subst_lets(node, site.lets)):
                out.append(g.path)
        return out

    def src_path(self, path: str) -> str:
        """The path to patch in the source document (the sugar node for expanded statements)."""
        s = self.by_path.get(path)
        if s is not None and s.origin is not None and s.origin.startswith("/roles"):
            return s.origin
        return path

    def insert_point(self, path: str) -> str:
        """Where to insert a statement that all threads must execute, just before `path`: before the
        outermost thread-dependent `if` around it (and before the sugar node for expanded code)."""
        p0 = self.src_path(path)
        s = self.by_path.get(p0)
        if s is None:
            return p0
        tg = self.thread_guards(s)
        return tg[0] if tg else p0

    def expanded(self, path: str) -> bool:
        s = self.by_path.get(path)
        return s is not None and s.origin is not None

    def before(self, a: str, b: str) -> bool:
        return self.order.get(a, -1) < self.order.get(b, -1)

    def sim(self):
        if not self._sim_done:
            self._sim_done = True
            try:
                self._sim = Simulator(self).run()
            except _Abort as e:  # not simulable (unknown names, thread-dependent bounds, too many steps)
                self._sim = None
                self.skipped = (e.why or "an expression the simulator cannot evaluate", e.path)
            except Exception:  # noqa: BLE001 - the analysis is best effort
                if STRICT:
                    raise
                self._sim = None
        return self._sim


_CACHE: list = []


def get(kernel: Kernel) -> KernelSync:
    for k, ks in _CACHE:
        if k is kernel:
            return ks
    ks = KernelSync(kernel)
    _CACHE.append((kernel, ks))
    if len(_CACHE) > 6:
        _CACHE.pop(0)
    return ks


# ------------------------------------------------------------------------------------ helpers
def innermost_loop_path(site: Site) -> Optional[str]:
    return site.loop_paths[-1] if site.loop_paths else None


def static_trip(loop: For, consts: dict) -> Optional[int]:
    s = E.try_const(E.parse_index(loop.start), consts)
    t = E.try_const(E.parse_index(loop.stop), consts)
    if isinstance(s, int) and isinstance(t, int):
        return max(0, -(-(t - s) // loop.step))
    return None


def phase_loop(site: Site, node: Optional[E.Node]) -> int:
    """Depth of the loop whose iterations are the phases of a barrier index: the innermost loop whose
    variable the (normalised) index uses, else the innermost loop; -1 outside loops."""
    if not site.loops:
        return -1
    fv = E.free_vars(node) if node is not None else set()
    for d in range(len(site.loops) - 1, -1, -1):
        if f"L{d}" in fv:
            return d
    return len(site.loops) - 1


def inner_multiplicity(site: Site, depth: int, consts) -> Optional[int]:
    m = 1
    for loop in site.loops[depth + 1:]:
        t = static_trip(loop, consts)
        if t is None:
            return None
        m *= t
    return m


def cluster_size(kernel: Kernel) -> int:
    """CTAs per thread block cluster (1 without launch.cluster)."""
    return int(np.prod(kernel.launch.cluster)) if kernel.launch.cluster else 1


def cluster_weight(kernel: Kernel, node) -> int:
    """How many times one CTA's barrier sees a cluster-wide operation, in the symmetric-cluster model (every
    CTA of the cluster runs the same statements): a multicast tma_load lands in this CTA from each CTA's issue,
    a cluster arrive arrives here from each CTA; 1 for anything else."""
    return cluster_size(kernel) if getattr(node, "multicast", False) or getattr(node, "cluster", False) else 1


def tile_bytes_of_tma(kernel: Kernel, copy: Copy) -> Optional[int]:
    """Bytes one TMA copy delivers to one CTA's barrier: the box (src tile shape / tensor map box / dst tile),
    times the cluster size for a multicast (`cluster_weight`)."""
    ref = copy.src if copy.kind == "tma_load" else copy.dst
    p = kernel.param(ref.buf)
    if not isinstance(p, TensorParam):
        return None
    shape = ref.shape or (p.tma.box if p.tma else None)
    if not shape:
        other = copy.dst if copy.kind == "tma_load" else copy.src
        b = kernel.buffer(other.buf)
        shape = other.shape or (b.shape if b else None)
    if not shape:
        return None
    return int(np.prod(shape)) * SIZE.get(p.dtype, 0) * cluster_weight(kernel, copy)


_SCOPE_INDEX = {"warp": "lane", "warpgroup": "wg_tid", "role": "role_tid", "cta": "tid"}


def bulk_issue_bytes(kernel: Kernel, sp: "ThreadSpace", mask, copy: Copy) -> Optional[int]:
    """Bytes that the threads of `mask` (bool array over `sp`) issue in one execution of a bulk_load:
    its copy r (a tile row, or the whole tile as one run: tiles.bulk_rows) goes to the thread whose
    index in the copy's scope is r % (scope threads), so a scope group that only partly executes the
    copy leaves copies (and their tx bytes) out."""
    plan = bulk_rows(kernel, copy.src, copy.dst)
    if plan is None:
        return None
    rows, row_bytes = plan.copies, plan.copy_bytes
    n_exec = int(np.count_nonzero(mask))
    if copy.scope == "thread":
        return n_exec * rows * row_bytes
    T = threads_in_scope(copy.scope, sp.n, kernel.launch.threads)
    t = sp.arr[_SCOPE_INDEX[copy.scope]][mask]
    per_thread = np.where(t < rows, (rows - 1 - t) // T + 1, 0)
    return int(per_thread.sum()) * row_bytes


def smem_refs(node) -> list[tuple[TileRef, bool]]:
    """(tile ref, is_write) of a statement's operands (smem or not; callers filter)."""
    out = []
    if isinstance(node, Copy):
        out += [(node.src, False), (node.dst, True)]
    elif isinstance(node, Access):
        out += [(node.src, False), (node.dst, True)]
    elif isinstance(node, Wgmma):
        out += [(node.a, False), (node.b, False)]
    elif isinstance(node, (Fill, Map)):
        out += [(node.dst, True)]
    elif isinstance(node, (Reduce, Scan)):
        out += [(node.src, False)] + ([(node.dst, False)] if isinstance(node, Reduce) and node.accumulate else []) \
            + [(node.dst, True)]
    elif isinstance(node, TopK):
        out += [(r, False) for r in (node.row_bias, node.col_bias, node.given_bound) if r is not None]
        out += [(node.src, False), (node.vals, True), (node.idx, True)]
        out += [(r, True) for r in (node.queue_vals, node.queue_idx) if r is not None]
    elif isinstance(node, TopKMerge):
        out += [(node.vals, True), (node.idx, True)]
        out += [(r, True) for r in (node.queue_vals, node.queue_idx) if r is not None]
    elif isinstance(node, TopKBound):   # its bound is a global word (like a topk's shared bound)
        out += [(node.vals, node.mode == "load")]
    elif isinstance(node, OneHot):
        out += [(node.index, False), (node.dst, True)]
    elif isinstance(node, ScatterAdd):
        out += [(node.index, False)] + ([(node.src, False)] if node.src is not None else []) + [(node.dst, True)]
    elif isinstance(node, RedAdd):
        out += [(node.src, False), (node.dst, True)]
    elif isinstance(node, RowSelect):   # (its scratch: barriers of its own before and after)
        out += [(r, False) for r in (node.src, node.src_idx, node.row_bias, node.col_bias) if r is not None]
        out += [(node.vals, True), (node.idx, True), (node.scratch, True)]
    elif isinstance(node, BucketOffsets):   # (its scratch: barriers of its own before and after)
        out += [(node.counts, False), (node.dst, True), (node.scratch, True)]
    elif isinstance(node, BucketPlace):
        out += [(node.keys, False), (node.cursor, False), (node.cursor, True), (node.ids, True),
                (node.sorted_keys, True)]
    elif isinstance(node, SegmentSums):
        out += [(node.src, False), (node.ids, False), (node.keys, False), (node.dst, True)]
    return out


def is_smem(kernel: Kernel, ref: TileRef) -> bool:
    b = kernel.buffer(ref.buf)
    return b is not None and b.space == "smem"


def next_path(path: str) -> str:
    head, _, idx = path.rpartition("/")
    try:
        return f"{head}/{int(idx) + 1}"
    except ValueError:
        return path


def dump(node) -> dict:
    return node.model_dump(mode="json", by_alias=True, exclude_unset=True)


def one_thread_cond(site: Site) -> str:
    return "tid == 0" if site.role is None else "role_tid == 0"


# -------------------------------------------------------------------------- numeric comparison
def param_samples(kernel: Kernel, ms=(256, 1024)) -> list[dict]:
    out = []
    for m in ms:
        env = {}
        for p in kernel.params:
            if isinstance(p, ScalarParam) and p.dtype != "f32":
                env[p.name] = _fit(p, m)
        out.append(env)
    return out


def _fit(p: ScalarParam, m: int) -> int:
    d = p.divisible_by
    lo = p.min if p.min is not None else 1
    v = max(lo, m)
    v = -(-v // d) * d
    if p.max is not None and v > p.max:
        v = p.max // d * d
        if v < lo:
            v = p.max
    return int(v)


def equal_on_samples(a: E.Node, b: E.Node, samples: list[dict]) -> Optional[bool]:
    """True if a == b on every sample env, False on a counterexample, None if not evaluable."""
    seen = False
    for env in samples:
        va, vb = E.try_const(a, env), E.try_const(b, env)
        if va is None or vb is None:
            return None
        seen = True
        if va != vb:
            return False
    return True if seen else None


# =============================================================================== simulation
BLOCK = object()
MAX_STEPS = 20000
RACE_WINDOW = 48


class _Abort(Exception):
    """The kernel cannot be simulated: `why` (and the statement `path`, when one is to blame) become
    KernelSync.skipped, which N-SYN-01 reports (the E-SYN / E-PIP race rules are silent then)."""

    def __init__(self, why: str = "", path: Optional[str] = None):
        super().__init__(why)
        self.why, self.path = why, path


@dataclass
class Acc:
    """One smem access in the simulated trace."""
    buf: str
    slots: frozenset
    region: object           # tuple of (lo, hi) per dim, or dict warp -> region (warp-local access)
    warps: frozenset
    write: bool
    kind: str                # generic | tma | tma_store | cp_async | wgmma
    start: int
    end: int
    proc: int
    path: str
    sig: Optional[tuple]     # same sig => same thread-to-element mapping
    single: Optional[int]    # tid when executed by one thread
    info: dict = field(default_factory=dict)


@dataclass
class GAcc:
    """One global-memory access in the simulated trace (E-SYN-12): the distinct elements it touches
    (flat indices, sorted) and, per element, the lowest/highest thread and warp touching it."""
    buf: str
    e: np.ndarray
    tmin: np.ndarray
    tmax: np.ndarray
    wmin: np.ndarray
    wmax: np.ndarray
    write: bool
    atomic: bool             # red.global / atom: atomics do not conflict with each other
    start: int
    end: int
    proc: int
    path: str
    op: str


def _written_tensors(ks, gparams: dict) -> frozenset:
    """Tensors some statement writes: reads of the others cannot conflict with anything."""
    out = set()
    for s in ks.sites:
        n = s.node
        if isinstance(n, Access) and n.op == "stg":
            out.add(n.dst.buf)
        elif isinstance(n, (RedAdd, ScatterAdd)) or (isinstance(n, Copy) and n.kind == "tma_store"):
            out.add(n.dst.buf)
    return frozenset(out & gparams.keys())


_SCOPE_INDEX = {"cta": "tid", "role": "role_tid", "warpgroup": "wg_tid", "warp": "lane"}


@dataclass
class Issue:
    code: str
    node: str
    message: str
    related: list = field(default_factory=list)
    legal: object = None
    fix: Optional[list] = None


@dataclass
class SimResult:
    sizes: dict
    issues: list
    deadlock: list            # (path, message)
    nodes: int
    accesses: int

    def of(self, code: str) -> list[Issue]:
        return [i for i in self.issues if i.code == code]


class _Graph:
    def __init__(self):
        self.anc: list[int] = []
        self.cross: list[int] = []
        self.crossw: list[int] = []
        self.fenced: list[int] = []
        self.path: list[str] = []

    def add(self, preds, path, coll=0, fence=False) -> int:
        a = c = w = f = 0
        anc, cross, crossw, fenced = self.anc, self.cross, self.crossw, self.fenced
        for p in preds:
            if p is None:
                continue
            a |= anc[p] | (1 << p)
            c |= cross[p]
            w |= crossw[p]
            f |= fenced[p]
        if coll == 2:
            c |= a
            w |= a
        elif coll == 1:
            w |= a
        if fence:
            f |= a
        n = len(anc)
        anc.append(a)
        cross.append(c)
        crossw.append(w)
        fenced.append(f)
        self.path.append(path)
        return n

    def hb(self, x: int, y: int) -> bool:
        return x == y or bool((self.anc[y] >> x) & 1)


class _MB:
    __slots__ = ("arrivals", "pending", "tx", "contrib", "phase", "done")

    def __init__(self, arrivals):
        self.arrivals = arrivals
        self.pending = arrivals
        self.tx = 0
        self.contrib: list = []
        self.phase = 0
        self.done: list = []


class _NB:
    __slots__ = ("count", "contrib", "gen", "done")

    def __init__(self):
        self.count = 0
        self.contrib: list = []
        self.gen = 0
        self.done: list = []


class _Proc:
    def __init__(self, idx, space: ThreadSpace, masks: list):
        self.idx = idx
        self.sp = space
        classes = [space.full] if space.full else [0]
        for m in dict.fromkeys(masks):
            nxt = []
            for c in classes:
                a, b = c & m, c & ~m
                if a:
                    nxt.append(a)
                if b:
                    nxt.append(b)
            classes = nxt or classes
            if len(classes) > 64:
                break
        self.cmasks = classes
        self.ncls = n = len(classes)
        self.last = [None] * n
        self.cp_pending = [[] for _ in range(n)]      # uncommitted cp.async: (comp, acc, path)
        self.cp_groups = [[] for _ in range(n)]       # committed, not retired: list of lists
        self.cp_untracked = [[] for _ in range(n)]    # not yet covered by a cp_async_arrive / wait 0
        self.cp_commits = [0] * n
        self.cp_lastwait = [None] * n                 # (path, commits at wait, n)
        self.wg_pending = [[] for _ in range(n)]
        self.wg_groups = [[] for _ in range(n)]
        self.wg_dirty = [None] * n                    # None: never fenced; else set of reg bufs
        self.wg_lastwait = [None] * n                 # path of the class's last wgmma_wait
        self.ts_pending = [[] for _ in range(n)]
        self.ts_groups = [[] for _ in range(n)]
        self.arrives: list = []                       # (node, path)
        self.waits: list = []                         # (node, path, barrier name)
        self.wgmma_nodes: list = []                   # (node, class set)
        self.acc_reads: list = []                     # (node, path, wgmma path, class)
        self.blocked = None
        self.done = False
        self.gen = None
        self._ccache: dict = {}

    def classes(self, mask: int) -> tuple:
        c = self._ccache.get(mask)
        if c is None:
            c = self._ccache[mask] = tuple(i for i, cm in enumerate(self.cmasks) if cm & mask)
        return c


class Simulator:
    def __init__(self, ks: KernelSync):
        self.ks = ks
        self.k = ks.k
        self.g = _Graph()
        self.steps = 0
        self.accs: list[Acc] = []
        self.issues: list[Issue] = []
        self.mb: dict = {}
        self.nb: dict = {}
        self.procs: list[_Proc] = []
        self._issue_keys: set = set()
        self._bufs = {b.name: b for b in self.k.buffers}
        self._smem = {b.name for b in self.k.buffers if b.space == "smem"}
        self._bars = {b.name: b for b in self.k.barriers}
        self._mcache: dict = {}
        self._comp_cache: dict = {}
        self._tcache: dict = {}
        self._rcache: dict = {}
        self._wcache: dict = {}
        self._pure_cache: dict = {}
        # global accesses (E-SYN-12): only tensors some statement writes can conflict
        self.gaccs: list[GAcc] = []
        self._gparams = {q.name: q for q in self.k.params if isinstance(q, TensorParam)}
        self._gwritten = _written_tensors(ks, self._gparams)
        self._gstrides: dict = {}
        self._gcache: dict = {}

    # ------------------------------------------------------------------ setup
    def _sizes(self) -> dict:
        k = self.k
        smax = 2
        for b in k.barriers:
            if isinstance(b, MBarrier):
                smax = max(smax, b.count)
        for b in k.buffers:
            smax = max(smax, b.stages)
        for p in k.pipelines:
            smax = max(smax, p.stages)
        target = max(6, smax + 3)  # every stage reused at least once (wrap-around bugs show there)
        best, best_key = None, None
        for j in range(4, 21):
            m = 1 << j
            env = self._base_env({p.name: _fit(p, m) for p in k.params
                                  if isinstance(p, ScalarParam) and p.dtype != "f32"})
            trips = self._param_trips(env)
            if not trips:
                return env  # no loop depends on the params
            if min(trips) >= target:
                return env
            # then: as many loops as possible running twice or more (a persistent CTA's tile loop runs
            # once until the problem outgrows the grid: its next-tile prefetch and slot reuse show only
            # from the second trip), within the simulation's budget
            key = (max(trips) <= 256, min(trips), sum(t >= 2 for t in trips))
            if best is not None and key > best_key and key[2] > best_key[2] and self._over_budget(env):
                continue
            if best is None or key > best_key:
                best, best_key = env, key
        return best

    def _over_budget(self, env) -> bool:
        k = self.k
        return self._estimate(k.prologue, env) + sum(self._estimate(r.body, env) for r in k.roles) > MAX_STEPS

    def _base_env(self, params: dict) -> dict:
        k = self.k
        env = dict(k.consts)
        env.update(params)
        grid = list(k.launch.grid) + [1] * (3 - len(k.launch.grid))
        for axis, gexpr in zip("xyz", grid):
            node = parse_i(gexpr)
            v = E.try_const(node, env) if node is not None else None
            env[f"nbid.{axis}"] = int(v) if isinstance(v, int) and v > 0 else 1
            env[f"bid.{axis}"] = 0
        return env

    def _param_trips(self, env) -> Optional[list]:
        pnames = {p.name for p in self.k.params}
        trips = []
        for s in self.ks.sites:
            if not isinstance(s.node, For):
                continue
            a, b = parse_i(s.node.start), parse_i(s.node.stop)
            if a is None or b is None:
                continue
            a, b = subst_lets(a, s.lets), subst_lets(b, s.lets)
            if not ((E.free_vars(a) | E.free_vars(b)) & pnames):
                continue
            lenv = dict(env)
            for lp in s.loops:
                st = parse_i(lp.start)
                v = E.try_const(subst_lets(st, s.lets), lenv) if st is not None else None
                lenv[lp.var] = v if isinstance(v, int) else 0
            va, vb = E.try_const(a, lenv), E.try_const(b, lenv)
            if isinstance(va, int) and isinstance(vb, int):
                trips.append(max(0, -(-(vb - va) // s.node.step)))
        return trips

    # ------------------------------------------------------------------ reporting
    def issue(self, code, node, message, related=(), legal=None, fix=None, key=None):
        key = key or (code, node)
        if key in self._issue_keys:
            return
        self._issue_keys.add(key)
        self.issues.append(Issue(code, node, message, [r for r in related if r], legal, fix))

    # ------------------------------------------------------------------ run
    def run(self) -> Optional[SimResult]:
        k = self.k
        for s in self.ks.sites:
            if isinstance(s.node, PipeOp):
                return None  # unexpanded sugar (unknown pipeline): E-PIP-01 reports it
        self.env0 = self._sizes()
        if self.env0 is None:
            raise _Abort("no launch sizes could be sampled that satisfy the scalar params' facts")
        est = self._estimate(k.prologue, self.env0) + sum(self._estimate(r.body, self.env0) for r in k.roles)
        if est > MAX_STEPS:   # too large to unroll
            raise _Abort(f"about {int(est)} statement executions at the sampled sizes, over the budget of {MAX_STEPS}")
        # processes: prologue (all CTA threads) then one per role
        pro_sp = self.ks.space(None)
        pro_masks = [pro_sp.to_int(m) for s in self.ks.sites if s.role is None
                     for m in [self.ks.mask(s)] if m is not None]
        pro = _Proc(0, pro_sp, pro_masks)
        self.procs.append(pro)
        start = self.g.add([], "/prologue")
        pro.last = [start] * pro.ncls
        pro.gen = self._body(pro, k.prologue, "/prologue", dict(self.env0), {}, pro_sp.full)
        self._schedule([pro])
        if not pro.done:
            return self._result()
        roles = []
        for ri, role in enumerate(k.roles):
            sp = self.ks.space(ri)
            masks = [sp.to_int(m) for s in self.ks.sites if s.role_index == ri
                     for m in [self.ks.mask(s)] if m is not None]
            p = _Proc(ri + 1, sp, masks)
            # threads of this role start after their prologue
            bits = sp.full << (sp.first * 32)
            st = self.g.add([pro.last[c] for c in pro.classes(bits)], f"/roles/{ri}")
            p.last = [st] * p.ncls
            p.gen = self._body(p, role.body, f"/roles/{ri}/body", dict(self.env0), {}, sp.full)
            self.procs.append(p)
            roles.append(p)
        self._schedule(roles)
        for p in self.procs:
            if p.done:
                self._at_exit(p)
        return self._result()

    def _schedule(self, procs):
        active = list(procs)
        while active:
            before = self.steps
            still = []
            for p in active:
                try:
                    r = next(p.gen)
                    while r is not BLOCK:
                        r = next(p.gen)
                    still.append(p)
                except StopIteration:
                    p.done = True
            active = still
            if active and self.steps == before:
                # The role interpreter is sequential: threads that skip a thread-guarded region in which
                # another thread blocks are delayed too. Claim a deadlock only when no delayed thread has
                # synchronisation work after that region (else the hang may be an artefact).
                if all(self._certain(p) for p in active):
                    for p in active:
                        self.deadlock.append(p.blocked)
                return

    _SYNC_OPS = (MbarArrive, MbarExpectTx, CpAsyncArrive, MbarWait, NamedBarSync)

    def _certain(self, p: _Proc) -> bool:
        if not p.blocked:
            return False
        s = self.ks.by_path.get(p.blocked[0])
        if s is None:
            return False
        tg = self.ks.thread_guards(s)
        if not tg:
            return True
        g = tg[0]
        gi = self.ks.order.get(g, 0)
        for t in self.ks.sites:
            if t.role_index != s.role_index or self.ks.order[t.path] <= gi or t.path.startswith(g + "/"):
                continue
            n = t.node
            if isinstance(n, self._SYNC_OPS) or (isinstance(n, Copy) and n.kind in ("tma_load", "bulk_load",
                                                                                   "cp_async")) or \
                    (isinstance(n, SimpleSync) and n.op == "syncthreads"):
                return False
        # the guarded region must not sit inside a loop that runs it again for the other threads
        return not any(self.ks.order.get(lp, -1) < gi and g.startswith(lp + "/") for lp in s.loop_paths)

    def _result(self) -> SimResult:
        self._analyse()
        return SimResult(self.sizes_shown(), self.issues, self.deadlock, len(self.g.anc), len(self.accs))

    def sizes_shown(self) -> dict:
        return {p.name: self.env0.get(p.name) for p in self.k.params
                if isinstance(p, ScalarParam) and p.name in self.env0}

    @property
    def deadlock(self):
        if not hasattr(self, "_deadlock"):
            self._deadlock = []
        return self._deadlock

    # ------------------------------------------------------------------ evaluation
    def _step(self):
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _Abort(f"more than {MAX_STEPS} statement executions at the sampled sizes")

    def _comp(self, path, fld, expr, tl, cond=False):
        """(node, thread-dependent?, uniform free vars) of an expression at a statement; lexical, so
        cached per (path, field)."""
        key = (path, fld)
        c = self._comp_cache.get(key)
        if c is None:
            node = parse_c(expr) if cond else parse_i(expr)
            if node is None:
                raise _Abort()
            if tl:
                node = subst_lets_map(node, tl)
            td = is_thread_dep(node)
            c = self._comp_cache[key] = (node, td, tuple(sorted(E.free_vars(node) - THREAD_NAMES)),
                                         None if td else compile_index(node))
        return c

    @staticmethod
    def _call(fn, node, env):
        if fn:
            try:
                return fn(env)
            except (KeyError, ZeroDivisionError, TypeError):
                raise _Abort()
        v = E.try_const(node, env)
        if v is None:
            raise _Abort()
        return v

    def _uval(self, path, fld, expr, env, tl) -> int:
        """A value the same for every thread (a loop's bounds, once `_exec` has sent loops with
        thread-dependent bounds to `_for_divergent`)."""
        node, td, fv, fn = self._comp(path, fld, expr, tl)
        return self._call(fn, node, env)

    def _tval(self, path, fld, expr, env, tl, p: _Proc, mask):
        """Value of an index expression for the executing threads: int or numpy array over them."""
        node, td, fv, fn = self._comp(path, fld, expr, tl)
        if not td:
            return self._call(fn, node, env)
        key = (path, fld, tuple(env.get(v) for v in fv), mask)
        r = self._tcache.get(key)
        if r is None:
            full = dict(env)
            full.update(p.sp.arr)
            marr = p.sp.to_arr(mask)
            try:
                v = _ev(node, full, p.sp, marr)
            except Unknown:
                raise _Abort()
            r = self._tcache[key] = np.asarray(v)[marr] if isinstance(v, np.ndarray) else v
        return r

    def _guard(self, st: If, path, env, tl, p: _Proc, mask):
        node, td, fv, fn = self._comp(path, "cond", st.cond, tl, cond=True)
        if not td:
            v = self._call(fn, node, env)
            return (mask, 0) if v else (0, mask)
        key = (path, tuple(env.get(v) for v in fv), mask)
        r = self._mcache.get(key)
        if r is None:
            full = dict(env)
            full.update(p.sp.arr)
            try:
                c = p.sp.to_int(_cond(node, full, p.sp, p.sp.to_arr(mask), None))
            except Unknown:
                raise _Abort()
            r = self._mcache[key] = (mask & c, mask & ~c)
        return r

    def _node(self, p: _Proc, mask, path, extra=(), coll=0, fence=False, update=True):
        self._step()
        cls = p.classes(mask)
        preds = [p.last[c] for c in cls]
        preds.extend(extra)
        n = self.g.add(dict.fromkeys(preds), path, coll, fence)
        if update:
            for c in cls:
                p.last[c] = n
        return n, cls

    # ------------------------------------------------------------------ tiles
    def _region(self, ref: TileRef, fld, path, env, tl, p, mask, local: bool):
        b = self._bufs.get(ref.buf)
        if b is None or b.space != "smem":
            return None
        shape = list(ref.shape) if ref.shape else list(b.shape)
        offs = list(ref.offset) if ref.offset else [0] * len(shape)
        if len(offs) != len(shape):
            offs = [0] * len(shape)
            shape = list(b.shape)
        slot = self._tval(path, fld + "/slot", ref.slot if ref.slot is not None else 0, env, tl, p, mask)
        vals = [self._tval(path, f"{fld}/offset/{i}", o, env, tl, p, mask) for i, o in enumerate(offs)]
        arrays = isinstance(slot, np.ndarray) or any(isinstance(v, np.ndarray) for v in vals)
        mkey = mask
        wset = self._wcache.get((p.idx, mkey))
        if wset is None:
            wset = self._wcache[(p.idx, mkey)] = frozenset(int(w) for w in np.unique(p.sp.gwarp[p.sp.to_arr(mask)]))
        if not arrays:
            return b, frozenset((int(slot),)), tuple((int(v), int(v) + sh) for v, sh in zip(vals, shape)), wset
        key = (path, fld, tuple(v if not isinstance(v, np.ndarray) else v.tobytes() for v in [slot] + vals), mkey,
               local)
        r = self._rcache.get(key)
        if r is not None:
            return r
        slots = frozenset(int(x) for x in np.unique(slot)) if isinstance(slot, np.ndarray) else frozenset([int(slot)])
        if any(isinstance(v, np.ndarray) for v in vals) and local:
            warps_exec = p.sp.gwarp[p.sp.to_arr(mask)]          # ascending: each warp's threads are contiguous
            starts = np.flatnonzero(np.diff(warps_exec)) + 1
            starts = np.concatenate(([0], starts))
            wids = [int(w) for w in warps_exec[starts]]
            cols = []
            for v, sh in zip(vals, shape):
                if isinstance(v, np.ndarray):
                    lo = np.minimum.reduceat(v, starts).tolist()
                    hi = np.maximum.reduceat(v, starts).tolist()
                    cols.append([(a, b + sh) for a, b in zip(lo, hi)])
                else:
                    cols.append([(int(v), int(v) + sh)] * len(wids))
            region = {w: tuple(c[i] for c in cols) for i, w in enumerate(wids)}
        else:
            reg = []
            for v, sh in zip(vals, shape):
                if isinstance(v, np.ndarray):
                    reg.append((int(v.min()), int(v.max()) + sh))
                else:
                    reg.append((int(v), int(v) + sh))
            region = tuple(reg)
        r = self._rcache[key] = (b, slots, region, wset)
        return r

    def _acc(self, ref, write, kind, start, end, p, mask, path, env, tl, local=False, sig=None, fld="t"):
        r = self._region(ref, fld, path, env, tl, p, mask, local)
        if r is None:
            return None
        b, slots, region, wset = r
        single = p.sp.single_tid(mask)
        a = Acc(b.name, slots, region, wset, write, kind, start, end, p.idx, path, sig, single)
        if not write:
            cls = p.classes(mask)
            if cls and p.cp_lastwait[cls[0]] is not None:
                a.info["wait"] = p.cp_lastwait[cls[0]]
        self.accs.append(a)
        return a

    def _sig(self, node, ref: TileRef, other: TileRef):
        rb = self.k.buffer(other.buf)
        if rb is None:
            return None
        return ("ls", ref.buf, str(ref.slot), tuple(map(str, ref.offset or ())), tuple(ref.shape or ()),
                rb.layout, rb.scope, rb.vec, tuple(map(str, other.offset or ())), tuple(other.shape or ()))

    # ------------------------------------------------------------------ interpreter
    def _body(self, p, stmts, base, env, tl, mask) -> Iterator:
        copied = False
        for i, st in enumerate(stmts):
            path = f"{base}/{i}"
            if isinstance(st, Let):
                if not copied:
                    env, tl, copied = dict(env), dict(tl), True
                node = parse_i(st.value)
                if node is None:
                    raise _Abort()
                node = ld_representative(node)
                if tl:
                    node = subst_lets_map(node, tl)
                if is_thread_dep(node):
                    tl[st.name] = node
                    env.pop(st.name, None)
                else:
                    v = E.try_const(node, env)
                    if not isinstance(v, int):
                        raise _Abort()
                    env[st.name] = v
                    tl.pop(st.name, None)
                continue
            yield from self._exec(p, st, path, env, tl, mask)

    def _exec(self, p: _Proc, st, path, env, tl, mask):
        if not mask:
            return
        t = type(st)
        if t not in _CONTROL:
            if t is MbarWait:
                yield from self._wait(p, st, path, env, tl, mask)
            elif t is NamedBarSync or (t is SimpleSync and st.op == "syncthreads"):
                yield from self._barsync(p, st, path, env, tl, mask)
            else:
                self._op(p, st, path, env, tl, mask)
            return
        if isinstance(st, For):
            if self._comp(path, "start", st.start, tl)[1] or self._comp(path, "stop", st.stop, tl)[1]:
                yield from self._for_divergent(p, st, path, env, tl, mask)
                return
            a = self._uval(path, "start", st.start, env, tl)
            b = self._uval(path, "stop", st.stop, env, tl)
            if self._pure(st):
                b = min(b, a + st.step)  # register-only loop: one iteration shows its effect
            for v in range(a, b, st.step):
                yield from self._iteration(p, st, path, env, tl, v, mask)
            return
        if isinstance(st, If):
            mt, me = self._guard(st, path, env, tl, p, mask)
            gens = []
            if mt and st.then:
                gens.append(self._body(p, st.then, path + "/then", env, tl, mt))
            if me and st.else_:
                gens.append(self._body(p, st.else_, path + "/else", env, tl, me))
            if len(gens) == 1:
                yield from gens[0]
            elif gens:
                yield from self._fork(gens)
            return
        if isinstance(st, (Block, LastCta)):  # last_cta: its body runs CTA-uniformly (in one CTA)
            if isinstance(st, LastCta):
                # lowered as syncthreads + threadfence + atom + syncthreads: the body is ordered after
                # everything the role's threads did before it (E-SYN-12: red_add flush -> ldg in the body)
                self._node(p, mask, path, coll=2)
            yield from self._body(p, st.body, path + "/body", env, tl, mask)
            return
        if isinstance(st, MbarWait):
            yield from self._wait(p, st, path, env, tl, mask)
            return
        if isinstance(st, (NamedBarSync,)) or (isinstance(st, SimpleSync) and st.op == "syncthreads"):
            yield from self._barsync(p, st, path, env, tl, mask)
            return
        self._op(p, st, path, env, tl, mask)

    def _for_divergent(self, p: _Proc, st: For, path, env, tl, mask):
        """A loop whose bounds differ between threads (e.g. a per-warp strided loop): iteration v runs
        with the threads whose own range holds v, as an `if` around the body would; a thread that has
        left the loop reaches what follows it only after the last iteration in this trace, which the
        happens-before graph (program order per thread class, barriers across) does not take as
        ordering. A register-only body runs its first iteration only, as for uniform loops."""
        a = self._tval(path, "start", st.start, env, tl, p, mask)
        b = self._tval(path, "stop", st.stop, env, tl, p, mask)
        bits = np.flatnonzero(p.sp.to_arr(mask))
        a_arr = np.broadcast_to(np.asarray(a), bits.shape)
        b_arr = np.broadcast_to(np.asarray(b), bits.shape)
        lo, hi = int(a_arr.min()), int(b_arr.max())
        if self._pure(st):
            hi = min(hi, int(a_arr.max()) + st.step)
        for v in range(lo, hi, st.step):
            sel = bits[(a_arr <= v) & (v < b_arr) & ((v - a_arr) % st.step == 0)]
            if not sel.size:
                self._step()   # (an empty iteration still counts against the budget)
                continue
            sub = np.zeros(p.sp.n, dtype=bool)
            sub[sel] = True
            yield from self._iteration(p, st, path, env, tl, v, p.sp.to_int(sub))

    def _iteration(self, p: _Proc, st: For, path, env, tl, v: int, mask):
        """One iteration of a loop's body with its variable at `v`, run by `mask`."""
        self._step()
        env2 = env.copy()
        env2[st.var] = v
        tl2 = tl
        if st.var in tl:
            tl2 = dict(tl)
            tl2.pop(st.var)
        yield from self._body(p, st.body, path + "/body", env2, tl2, mask)

    _IMPURE = (MbarWait, MbarArrive, MbarExpectTx, CpAsyncArrive, NamedBarSync, SimpleSync, WaitGroup, Fence,
               Copy, Wgmma, MbarInit, PipeOp)

    def _pure(self, st) -> bool:
        """A loop whose body touches only registers (no smem, no synchronisation)."""
        r = self._pure_cache.get(id(st))
        if r is None:
            r = self._pure_cache[id(st)] = self._pure_body(st.body)
        return r

    def _pure_body(self, body) -> bool:
        for st in body:
            if isinstance(st, self._IMPURE):
                return False
            if isinstance(st, (TopK, TopKMerge, TopKBound, ScatterAdd, RedAdd, LastCta)):
                return False
            if isinstance(st, (For, Block)):
                if not self._pure_body(st.body):
                    return False
            elif isinstance(st, If):
                if not (self._pure_body(st.then) and self._pure_body(st.else_)):
                    return False
            elif isinstance(st, (Access, Fill, Map, Reduce, Scan)):
                if any(self._is_smem(ref) for ref, _ in smem_refs(st)):
                    return False
                if isinstance(st, Access) and any(
                        getattr(self._gparams.get(ref.buf), "access", None) == "readwrite" for ref in (st.src, st.dst)):
                    return False  # a workspace read and written: every iteration matters for E-SYN-12
                if isinstance(st, Map):
                    try:
                        names = E.free_vars(E.parse_value(st.expr))
                    except E.ExprError:
                        return False
                    if names & self._smem:
                        return False
        return True

    def _estimate(self, body, env, depth=0) -> float:
        """Rough number of statement executions (loop bounds at the sampled sizes)."""
        total = 0.0
        env = dict(env)
        for st in body:
            total += 1
            if isinstance(st, Let):
                node = parse_i(st.value)
                v = E.try_const(ld_representative(node), env) if node is not None else None
                if isinstance(v, int):
                    env[st.name] = v
            elif isinstance(st, For):
                a, b = E.try_const(parse_i(st.start) or E.Num(0), env), E.try_const(parse_i(st.stop) or E.Num(0), env)
                trips = max(0, -(-(b - a) // st.step)) if isinstance(a, int) and isinstance(b, int) else 1
                if self._pure(st):
                    trips = min(trips, 1)
                e2 = dict(env)
                e2[st.var] = a if isinstance(a, int) else 0
                total += trips * (1 + self._estimate(st.body, e2, depth + 1))
            elif isinstance(st, If):
                total += self._estimate(st.then, env, depth + 1) + self._estimate(st.else_, env, depth + 1)
            elif isinstance(st, Block):
                total += self._estimate(st.body, env, depth + 1)
            if total > MAX_STEPS:
                return total
        return total

    def _fork(self, gens):
        alive = list(gens)
        while alive:
            still = []
            for g in alive:
                try:
                    r = next(g)
                    while r is not BLOCK:
                        r = next(g)
                    still.append(g)
                except StopIteration:
                    pass
            alive = still
            if alive:
                yield BLOCK

    # ---- mbarriers
    def _mbars(self, ref, env, tl, p, mask, path) -> list:
        """[(thread submask, barrier state)]: the executing threads grouped by the barrier index they
        address (one group unless the index depends on the thread, e.g. one barrier per warpgroup)."""
        decl = self._bars.get(ref.name)
        if not isinstance(decl, MBarrier):
            raise _Abort()
        idx = self._tval(path, "barrier/index", ref.index, env, tl, p, mask)
        if isinstance(idx, np.ndarray):
            u = np.unique(idx)
            if u.size == 1:
                groups = [(mask, int(u[0]))]
            else:
                bits = np.flatnonzero(p.sp.to_arr(mask))
                groups = []
                for v in u:
                    sub = np.zeros(p.sp.n, dtype=bool)
                    sub[bits[idx == v]] = True
                    groups.append((p.sp.to_int(sub), int(v)))
        else:
            groups = [(mask, int(idx))]
        out = []
        for sub, i in groups:
            if not 0 <= i < decl.count:
                raise _Abort()
            key = (ref.name, i)
            st = self.mb.get(key)
            if st is None:
                st = self.mb[key] = _MB(decl.arrivals)
            out.append((sub, st, i))
        return out

    def _mb_check(self, st: _MB, path):
        guard = 0
        while st.pending <= 0 and st.tx == 0 and guard < 4:
            guard += 1
            comp = self.g.add(st.contrib, path, coll=2)
            st.done.append(comp)
            st.phase += 1
            st.pending += st.arrivals
            st.contrib = []

    def _wait(self, p, st: MbarWait, path, env, tl, mask):
        groups = self._mbars(st.barrier, env, tl, p, mask, path)
        par = self._tval(path, "parity", st.parity, env, tl, p, mask)
        if isinstance(par, np.ndarray):
            u = np.unique(par)
            if u.size != 1:
                raise _Abort()
            par = int(u[0])
        par = int(par) % 2
        extra = []
        for sub, mb, i in groups:
            while mb.phase % 2 == par:
                p.blocked = (path, f"waits on {st.barrier.name}[{i}] for parity {par}, which never completes (the "
                                   f"barrier is in phase {mb.phase}, {max(mb.pending, 0)} arrival(s) and {mb.tx} tx "
                                   "byte(s) outstanding)")
                yield BLOCK
            if mb.phase >= 1:
                extra.append(mb.done[mb.phase - 1])
        n, _ = self._node(p, mask, path, extra)
        p.waits.append((n, path, st.barrier.name))

    def _barsync(self, p, st, path, env, tl, mask):
        if isinstance(st, SimpleSync):
            bid, need, arrive_only = 0, -(-self.k.launch.threads // 32) * 32, False
        else:
            decl = self.k.barrier(st.barrier)
            if not isinstance(decl, NamedBarrier):
                raise _Abort()
            bid, need, arrive_only = decl.bar_id, decl.threads, st.op == "bar_arrive"
            if bid == 0:
                need = -(-self.k.launch.threads // 32) * 32
        nb = self.nb.get(bid)
        if nb is None:
            nb = self.nb[bid] = _NB()
        a, _ = self._node(p, mask, path)
        nb.contrib.append(a)
        nb.count += p.sp.warps_int(mask) * 32
        gen = nb.gen
        while nb.count >= need and need > 0:
            comp = self.g.add(nb.contrib, path, coll=2)
            nb.done.append(comp)
            nb.gen += 1
            nb.count -= need
            nb.contrib = []
        if arrive_only:
            return
        while nb.gen <= gen:
            p.blocked = (path, f"{st.op} never completes: fewer than {need} threads reach barrier {bid}")
            yield BLOCK
        self._node(p, mask, path, [nb.done[gen]])

    def _is_smem(self, ref) -> bool:
        return ref.buf in self._smem

    # ---- everything that does not block
    def _op(self, p: _Proc, st, path, env, tl, mask):
        k = self.k
        if isinstance(st, Copy):
            src_smem, dst_smem = self._is_smem(st.src), self._is_smem(st.dst)
            if st.kind in ("tma_load", "bulk_load"):   # async copies completing on `barrier` as tx bytes
                n, cls = self._node(p, mask, path)
                comp = self.g.add([n], path)
                a = self._acc(st.dst, True, "tma", n, comp, p, mask, path, env, tl, fld="dst")
                if a is not None and st.barrier is not None:
                    a.info["barrier"] = st.barrier.name
                if st.barrier is not None:
                    for sub, mb, _ in self._mbars(st.barrier, env, tl, p, mask, path):
                        if st.kind == "tma_load":     # one box per issuing thread
                            nbytes = (tile_bytes_of_tma(k, st) or 0) * sub.bit_count()
                        else:                         # the tile's rows dealt over the scope's threads
                            nbytes = bulk_issue_bytes(k, p.sp, p.sp.to_arr(sub), st)
                            if nbytes is None:
                                raise _Abort()
                        mb.contrib.append(comp)
                        mb.tx -= nbytes
                        self._mb_check(mb, path)
                return
            if st.kind == "tma_store":
                n, cls = self._node(p, mask, path)
                comp = self.g.add([n], path)
                a = self._acc(st.src, False, "tma_store", n, comp, p, mask, path, env, tl, fld="src")
                for c in cls:
                    p.ts_pending[c].append((comp, path))
                return
            if st.kind == "cp_async":
                n, cls = self._node(p, mask, path)
                comp = self.g.add([n], path)
                a = self._acc(st.dst, True, "cp_async", n, comp, p, mask, path, env, tl, fld="dst",
                              local=st.scope in ("thread", "warp"))
                for c in cls:
                    p.cp_pending[c].append((comp, a, path))
                    p.cp_untracked[c].append((comp, path))
                return
            # sync copy: generic read of src (if smem), generic write of dst
            n, cls = self._node(p, mask, path)
            if src_smem:
                self._acc(st.src, False, "generic", n, n, p, mask, path, env, tl, local=st.scope in ("thread", "warp"), fld="src")
            if dst_smem:
                self._acc(st.dst, True, "generic", n, n, p, mask, path, env, tl, local=st.scope in ("thread", "warp"), fld="dst")
            return
        if isinstance(st, Access):
            n, cls = self._node(p, mask, path)
            for ref, other, write in ((st.src, st.dst, False), (st.dst, st.src, True)):
                if self._is_smem(ref):
                    rb = k.buffer(other.buf)
                    local = st.op == "ldmatrix" or (rb is not None and rb.scope in ("thread", "warp"))
                    self._acc(ref, write, "generic", n, n, p, mask, path, env, tl, local=local, fld="dst" if write else "src",
                              sig=self._sig(st, ref, other) if st.op in ("lds", "sts") else None)
                elif ref.buf in self._gwritten:
                    self._gacc(ref, other, write, False, n, p, mask, path, env, tl, "dst" if write else "src", st.op)
                else:
                    self._reg_touch(p, cls, ref.buf, path, n, write)
            return
        if isinstance(st, Wgmma):
            n, cls = self._node(p, mask, path)
            comp = self.g.add([n], path)
            acc_buf = st.acc.buf
            for c in cls:
                d = p.wg_dirty[c]
                if d is None or acc_buf in d or (not self._is_smem(st.a) and st.a.buf in d):
                    why = ("no wgmma_fence precedes the first wgmma of the role" if d is None else
                           f"{acc_buf!r} was retired by wgmma_wait or accessed by ordinary instructions since the "
                           "last wgmma_fence")
                    self.issue("E-SYN-07", path, f"wgmma without a preceding wgmma_fence: {why}; the async "
                               "proxy may read stale accumulator registers",
                               fix=[{"op": "add", "path": self.ks.src_path(path),
                                     "value": {"op": "wgmma_fence"}}])
                    p.wg_dirty[c] = set()
            for fld, ref in (("a", st.a), ("b", st.b)):
                if self._is_smem(ref):
                    self._acc(ref, False, "wgmma", n, comp, p, mask, path, env, tl, fld=fld)
            for c in cls:
                p.wg_pending[c].append((comp, path, acc_buf))
                if not self._is_smem(st.a):     # an A fragment in registers is read until the wgmma retires
                    p.wg_pending[c].append((comp, path, st.a.buf))
            p.wgmma_nodes.append((n, cls))
            return
        if isinstance(st, (MbarArrive, MbarExpectTx, CpAsyncArrive)):
            groups = self._mbars(st.barrier, env, tl, p, mask, path)
            if isinstance(st, CpAsyncArrive):
                cls = p.classes(mask)
                extra = [c for cl in cls for c, _ in p.cp_untracked[cl]]
                n, _ = self._node(p, mask, path, extra, update=False)
                for cl in cls:
                    p.cp_untracked[cl] = []
            else:
                n, cls = self._node(p, mask, path)
            lastwait = p.wg_lastwait[cls[0]] if isinstance(st, MbarArrive) and cls else None
            p.arrives.append((n, path, frozenset(i for _, _, i in groups), lastwait))
            for sub, mb, _ in groups:
                mb.contrib.append(n)
                if isinstance(st, MbarExpectTx):
                    mb.tx += st.bytes * sub.bit_count()
                mb.pending -= sub.bit_count() * cluster_weight(k, st)
                self._mb_check(mb, path)
            return
        if isinstance(st, MbarInit):
            self._node(p, mask, path)
            return
        if isinstance(st, SimpleSync):
            op = st.op
            if op == "syncwarp":
                self._node(p, mask, path, coll=1)
                return
            n, cls = self._node(p, mask, path)
            for c in cls:
                if op == "cp_async_commit":
                    grp = p.cp_pending[c]
                    p.cp_commits[c] += 1
                    for _, a, _ in grp:
                        if a is not None:
                            a.info.setdefault("group", p.cp_commits[c])
                    p.cp_groups[c].append(grp)
                    p.cp_pending[c] = []
                elif op == "wgmma_commit":
                    p.wg_groups[c].append(p.wg_pending[c])
                    p.wg_pending[c] = []
                elif op == "wgmma_fence":
                    p.wg_dirty[c] = set()
                elif op == "tma_store_commit":
                    p.ts_groups[c].append(p.ts_pending[c])
                    p.ts_pending[c] = []
            return
        if isinstance(st, WaitGroup):
            cls = p.classes(mask)
            extra = []
            keep = st.n
            for c in cls:
                if st.op == "cp_async_wait":
                    groups = p.cp_groups[c]
                    if p.cp_pending[c] and any(a is not None for _, a, _ in p.cp_pending[c]):
                        cp = p.cp_pending[c][0][2]
                        self.issue("E-SYN-06", cp, "cp.async copy is not committed before cp_async_wait at "
                                   f"{path}: wait_group only waits for committed groups, so the copy may still be in "
                                   "flight when its data is read", related=[path],
                                   fix=[{"op": "add", "path": self.ks.src_path(path),
                                         "value": {"op": "cp_async_commit"}}])
                elif st.op == "wgmma_wait":
                    groups = p.wg_groups[c]
                    if p.wg_pending[c]:
                        wp = p.wg_pending[c][-1][1]
                        self.issue("E-SYN-07", wp, f"wgmma is not committed (wgmma_commit) before wgmma_wait at "
                                   f"{path}: wait_group does not cover uncommitted wgmma, so its accumulator and smem "
                                   "operands stay in use", related=[path],
                                   fix=[{"op": "add", "path": next_path(self.ks.src_path(wp)),
                                         "value": {"op": "wgmma_commit"}}])
                else:
                    groups = p.ts_groups[c]
                retire = groups[:len(groups) - keep] if keep < len(groups) else []
                rest = groups[len(groups) - keep:] if keep and keep < len(groups) else (groups if keep >= len(groups) else [])
                for grp in retire:
                    for item in grp:
                        extra.append(item[0])
                if st.op == "cp_async_wait":
                    p.cp_groups[c] = list(rest)
                    p.cp_lastwait[c] = (path, p.cp_commits[c], st.n)
                    if st.n == 0:
                        p.cp_untracked[c] = [x for x in p.cp_untracked[c] if x[0] not in extra]
                elif st.op == "wgmma_wait":
                    p.wg_groups[c] = list(rest)
                    p.wg_lastwait[c] = path
                    # retired accumulators are back in ordinary registers: the next batch needs a fence
                    d = p.wg_dirty[c]
                    if d is not None:
                        d.update(w[2] for grp in retire for w in grp)
                else:
                    p.ts_groups[c] = list(rest)
            self._node(p, mask, path, extra)
            return
        if isinstance(st, Fence):
            self._node(p, mask, path, fence=st.kind == "proxy_async")
            return
        if isinstance(st, (Fill, Map, Reduce, Scan, TopK, TopKMerge, TopKBound, OneHot, ScatterAdd, RedAdd)):
            coll = 0
            if isinstance(st, (Reduce, Scan)):
                b = self._bufs.get(st.src.buf)
                if b is not None and b.space == "reg" and b.scope in ("warpgroup", "role", "cta"):
                    coll = 2  # lowered with a barrier over the scope (scratch smem)
                elif b is not None and b.space == "reg" and b.scope == "warp":
                    coll = 1
            n, cls = self._node(p, mask, path, coll=coll)
            refs = smem_refs(st)
            # a warp-scope smem reduce, and a topk over a warp's tile (its bias vectors), touch only the
            # executing warp's own evaluation of the tile: per-warp regions (a warp-private ring of slots
            # then needs a syncwarp, not a CTA barrier)
            src_b = self._bufs.get(st.src.buf) if isinstance(st, TopK) else None
            local = (isinstance(st, Reduce) and st.scope in ("thread", "warp")) or (
                src_b is not None and src_b.space == "reg" and src_b.scope in ("thread", "warp"))
            for ref, write in refs:
                if self._is_smem(ref):
                    # expressions are compiled and cached per (path, field): each operand under its own
                    # field name (a topk's bias vectors or a scatter_add's index read other slots and
                    # offsets than the statement's src)
                    fld = next((f for f in type(st).model_fields if getattr(st, f, None) is ref),
                               "dst" if write else "src")
                    # the same threads touch the same elements: element-wise ops on one tile, and an smem
                    # reduce's dst rows (row r by thread r mod the scope's size, for equal tiles and scope:
                    # `accumulate` reads what the previous reduce of the rows wrote, same thread)
                    tkey = (str(ref.slot), tuple(map(str, ref.offset or ())), tuple(ref.shape or ()))
                    sig = ("ew", ref.buf, *tkey) if isinstance(st, (Fill, Map)) else \
                        ("rd", ref.buf, *tkey, st.scope) if isinstance(st, Reduce) and ref is st.dst else None
                    self._acc(ref, write, "generic", n, n, p, mask, path, env, tl, fld=fld, local=local, sig=sig)
                elif write and isinstance(st, (RedAdd, ScatterAdd)) and ref.buf in self._gwritten:
                    src = self._bufs.get(st.src.buf) if st.src is not None else None
                    hint = (st.src.shape or (src.shape if src is not None else None)) if isinstance(st, RedAdd) else None
                    self._gacc(ref, None, True, True, n, p, mask, path, env, tl, "dst", st.op, hint)
                else:
                    self._reg_touch(p, cls, ref.buf, path, n, write)
            if isinstance(st, Map):
                node = None
                try:
                    node = E.parse_value(st.expr)
                except E.ExprError:
                    pass
                if node is not None:
                    for name in E.free_vars(node):
                        b = k.buffer(name)
                        if b is None:
                            continue
                        if b.space == "smem":
                            self._acc(TileRef(buf=name), False, "generic", n, n, p, mask, path, env, tl, fld="expr:" + name)
                        else:
                            self._reg_touch(p, cls, name, path, n, False)
            return
        if isinstance(st, MmaSync):
            n, cls = self._node(p, mask, path)
            return
        self._node(p, mask, path)

    def _reg_touch(self, p: _Proc, cls, buf, path, node, write):
        """An ordinary instruction accesses reg tile `buf`: wgmma accumulators must be retired."""
        for c in cls:
            d = p.wg_dirty[c]
            if d is not None:
                d.add(buf)
            inflight = [w for grp in p.wg_groups[c] for w in grp if w[2] == buf] + \
                       [w for w in p.wg_pending[c] if w[2] == buf]
            if inflight:
                p.acc_reads.append((node, path, inflight[-1][1], c))
                return

    # ------------------------------------------------------------------ global memory (E-SYN-12)
    def _gstride(self, tp: TensorParam) -> Optional[tuple]:
        """Row-major strides for flat element indices: each dim's extent at the sampled sizes plus a
        margin (tiles may hang over the edge under oob masking), so distinct coordinates never alias."""
        st = self._gstrides.get(tp.name, False)
        if st is not False:
            return st
        ext = []
        for d in tp.shape:
            node = parse_i(d)
            v = E.try_const(node, self.env0) if node is not None else None
            ext.append((v if isinstance(v, int) and v > 0 else 1 << 20) + (1 << 16))
        strides, acc = [], 1
        for x in reversed(ext):
            strides.append(acc)
            acc *= x
        st = tuple(reversed(strides)) if acc < (1 << 62) else None
        self._gstrides[tp.name] = st
        return st

    def _gacc(self, ref: TileRef, other: Optional[TileRef], write, atomic, n, p: _Proc, mask, path, env, tl, fld,
              op, shape_hint=None):
        r = self._gmap(ref, other, p, mask, path, env, tl, fld, shape_hint)
        if r is None or not r[0].size:
            return
        e, tmin, tmax, wmin, wmax = r
        self.gaccs.append(GAcc(ref.buf, e, tmin, tmax, wmin, wmax, write, atomic, n, n, p.idx, path, op))

    def _gmap(self, ref: TileRef, other, p: _Proc, mask, path, env, tl, fld, shape_hint):
        """Element -> thread mapping of a global tile access, from the register tile's layout:
        `row_major` (a per-thread array) and atomics (other None): every executing thread touches every
        element; `blocked` (the whole reg buffer): chunk q of `vec` elements belongs to the thread with
        scope index q % T. Other layouts (mma fragments, ...): None -- unknown, not guessed."""
        tp = self._gparams.get(ref.buf)
        strides = self._gstride(tp) if tp is not None else None
        if strides is None:
            return None
        part = None
        if other is None:
            shape = ref.shape or shape_hint
        else:
            rb = self._bufs.get(other.buf)
            if rb is None or rb.space != "reg":
                return None
            if rb.layout == "row_major":
                shape = ref.shape or other.shape or rb.shape
            elif rb.layout == "blocked":
                whole = all(str(o) == "0" for o in (other.offset or ())) and \
                    (not other.shape or list(other.shape) == list(rb.shape))
                shape = ref.shape or rb.shape
                if not whole or list(shape) != list(rb.shape):
                    return None
                part = rb
            else:
                return None
        if not shape or len(shape) != len(tp.shape):
            return None
        offs = list(ref.offset) if ref.offset else [0] * len(shape)
        if len(offs) != len(shape):
            return None
        vals = [self._tval(path, f"{fld}/offset/{i}", o, env, tl, p, mask) for i, o in enumerate(offs)]
        skey = (path, fld, mask)
        struct = self._gcache.get(skey)
        if struct is None:
            struct = self._gcache[skey] = self._gstruct(shape, strides, part, p, mask)
        if struct is None:
            return None
        lin, rows, tids, warps = struct
        if rows is None and not any(isinstance(v, np.ndarray) for v in vals):
            # every executing thread touches every element, at a uniform offset
            base = sum(int(v) * s for v, s in zip(vals, strides))
            k = lin.size
            return (lin + base, np.full(k, tids.min()), np.full(k, tids.max()),
                    np.full(k, warps.min()), np.full(k, warps.max()))
        if rows is None:  # all elements for each thread, thread-dependent offsets: enumerate pairs
            nt = tids.size
            if nt * lin.size > (1 << 18):
                return None
            rows = np.repeat(np.arange(nt), lin.size)
            cols = np.tile(np.arange(lin.size), nt)
        else:
            rows, cols = rows
        flat = lin[cols]
        for v, s in zip(vals, strides):
            if isinstance(v, np.ndarray):
                flat = flat + v[rows].astype(np.int64) * s
            else:
                flat = flat + int(v) * s
        t, w = tids[rows], warps[rows]
        order = np.argsort(flat, kind="stable")
        flat, t, w = flat[order], t[order], w[order]
        starts = np.concatenate(([0], np.flatnonzero(np.diff(flat)) + 1)) if flat.size else np.zeros(0, dtype=np.int64)
        if not flat.size:
            return flat, flat, flat, flat, flat
        return (flat[starts], np.minimum.reduceat(t, starts), np.maximum.reduceat(t, starts),
                np.minimum.reduceat(w, starts), np.maximum.reduceat(w, starts))

    def _gstruct(self, shape, strides, part, p: _Proc, mask):
        """(local flat offsets, (thread rows, element cols) for partitioned tiles or None, tids, warps)."""
        arr = p.sp.to_arr(mask)
        idx = np.flatnonzero(arr)
        if not idx.size:
            return None
        tids, warps = p.sp.tid[idx].astype(np.int64), p.sp.gwarp[idx].astype(np.int64)
        local = np.indices(shape).reshape(len(shape), -1)
        lin = np.zeros(local.shape[1], dtype=np.int64)
        for d, s in enumerate(strides):
            lin += local[d].astype(np.int64) * s
        if part is None or part.scope == "thread":
            return lin, None, tids, warps
        role = p.sp.role
        T = threads_in_scope(part.scope, role.threads if role is not None else p.sp.n, self.k.launch.threads)
        if idx.size * lin.size > (1 << 20):
            return None
        sidx = p.sp.arr[_SCOPE_INDEX[part.scope]][idx] % T
        owner = (np.arange(lin.size) // part.vec) % T
        rows, cols = np.nonzero(sidx[:, None] == owner[None, :])
        return lin, (rows, cols), tids, warps

    def _analyse_global(self):
        """E-SYN-12: two accesses to the same global elements by different threads of the CTA, at least
        one a (non-atomic) write, need a CTA barrier (bar.sync orders global memory within the CTA too)."""
        g = self.g
        by: dict = {}
        for a in self.gaccs:
            by.setdefault(a.buf, []).append(a)
        for buf, lst in by.items():
            lst.sort(key=lambda a: a.start)
            for j, a2 in enumerate(lst):
                anc2, cross2, crossw2 = g.anc[a2.start], g.cross[a2.start], g.crossw[a2.start]
                lo2, hi2 = int(a2.e[0]), int(a2.e[-1])
                if ("E-SYN-12", a2.path) in self._issue_keys:
                    continue
                for a1 in reversed(lst[max(0, j - RACE_WINDOW):j]):   # nearest earlier access first
                    if not (a1.write or a2.write) or (a1.atomic and a2.atomic) or a1.start == a2.start:
                        continue
                    if int(a1.e[-1]) < lo2 or hi2 < int(a1.e[0]):
                        continue
                    if (cross2 >> a1.end) & 1:
                        continue  # a CTA barrier in between
                    ordered = bool((anc2 >> a1.end) & 1)
                    if ordered and a1.proc != a2.proc:
                        continue  # ordered across roles only through barriers
                    key = ("E-SYN-12", a2.path)   # one report per access: the nearest conflicting one
                    _, i1, i2 = np.intersect1d(a1.e, a2.e, assume_unique=True, return_indices=True)
                    if not i1.size:
                        continue
                    t1a, t1b, t2a, t2b = a1.tmin[i1], a1.tmax[i1], a2.tmin[i2], a2.tmax[i2]
                    bad = ~((t1a == t1b) & (t2a == t2b) & (t1a == t2a))   # not one and the same thread
                    if not bad.any():
                        continue
                    w1a, w1b, w2a, w2b = a1.wmin[i1], a1.wmax[i1], a2.wmin[i2], a2.wmax[i2]
                    xw = bad & ~((w1a == w1b) & (w2a == w2b) & (w1a == w2a))
                    if ordered and not xw.any() and (crossw2 >> a1.end) & 1:
                        continue  # within one warp, a syncwarp suffices
                    k = int(np.flatnonzero(xw if xw.any() else bad)[0])
                    self._global_issue(a1, a2, int(a1.e[i1[k]]), (int(t1a[k]), int(t1b[k])), (int(t2a[k]), int(t2b[k])),
                                       ordered, key)
                    break

    def _global_issue(self, a1: GAcc, a2: GAcc, flat, th1, th2, ordered, key):
        st = self._gstrides.get(a1.buf) or ()
        coords, rem = [], flat
        for s in st:
            coords.append(rem // s)
            rem %= s
        kind = _hazard(a1, a2)
        thr = lambda t: f"thread {t[0]}" if t[0] == t[1] else f"threads {t[0]}..{t[1]}"  # noqa: E731
        done = lambda a: ("atomically updated" if a.atomic else "written") if a.write else "read"  # noqa: E731
        does = "atomically updates" if a2.atomic else ("writes" if a2.write else "reads")
        role = self.procs[a2.proc].sp.name()
        why = ("with no syncthreads / bar_sync between them" if ordered else
               "and nothing orders the two (different threads, no barrier on any path)")
        self.issue("E-SYN-12", a2.path,
                   f"{kind} conflict on global tensor {a2.buf} within one CTA ({role}): this {a2.op} {does} "
                   f"elements that other threads {'wrote' if a1.write else 'read'} at {a1.path} ({a1.op}) {why}, "
                   f"e.g. {a2.buf}[{', '.join(map(str, coords))}] is {done(a1)} by {thr(th1)} there and "
                   f"{done(a2)} by {thr(th2)} here; a fast warp can run ahead of a slow one. Insert a syncthreads "
                   f"(or the role's bar_sync) between the two accesses{_sizes(self)}",
                   related=[a1.path], fix=self._collective_fix(a2), key=key)

    # ------------------------------------------------------------------ end of a role
    def _at_exit(self, p: _Proc):
        ri = p.idx - 1
        body = f"/roles/{ri}/body/-" if ri >= 0 else "/prologue/-"
        for c in range(p.ncls):
            live = [(a, path) for grp in p.cp_groups[c] for _, a, path in grp if a is not None]
            live += [(a, path) for _, a, path in p.cp_pending[c] if a is not None]
            untracked = {comp for comp, _ in p.cp_untracked[c]}
            live = [(a, path) for a, path in live if a.end in untracked]
            if live:
                cp = live[0][1]
                self.issue("E-PIP-04", cp, "the role can finish with this cp.async group still in flight (no "
                           "cp_async_wait 0 after the last commit and no cp_async_arrive tracks it): the copy may "
                           "land after the block's shared memory is reused or released",
                           fix=[{"op": "add", "path": body, "value": {"op": "cp_async_wait", "n": 0}}])
            ts = [path for grp in p.ts_groups[c] for _, path in grp] + [path for _, path in p.ts_pending[c]]
            if ts:
                un = bool(p.ts_pending[c])
                fix = ([{"op": "add", "path": body, "value": {"op": "tma_store_commit"}}] if un else []) + \
                      [{"op": "add", "path": body, "value": {"op": "tma_store_wait", "n": 0}}]
                self.issue("E-PIP-04", ts[0], "the role finishes with this TMA store " +
                           ("never committed (tma_store_commit) and " if un else "") +
                           "not waited (tma_store_wait 0): the bulk copy may still read shared memory after the "
                           "block exits", fix=fix)
            wg = [path for grp in p.wg_groups[c] for _, path, _ in grp] + [path for _, path, _ in p.wg_pending[c]]
            if wg:
                self.issue("E-PIP-04", wg[-1], "the role finishes with this wgmma still in flight (no wgmma_wait 0 "
                           "after the last wgmma_commit)",
                           fix=[{"op": "add", "path": body, "value": {"op": "wgmma_wait", "n": 0}}])
        # accumulator reads while wgmma in flight
        last_wgmma = {}
        for n, cls in p.wgmma_nodes:
            for c in cls:
                last_wgmma[c] = max(last_wgmma.get(c, -1), n)
        for n, path, wpath, c in p.acc_reads:
            later = last_wgmma.get(c, -1) > n
            code = "E-SYN-07" if later else "E-PIP-04"
            self.issue(code, path, f"touches registers of the wgmma at {wpath} (its accumulator or A fragment) while "
                       "it may still be in flight: wgmma_wait(n) leaves the n most recent groups running; "
                       + ("wait with n = 0 after the last wgmma before reading the accumulator" if not later else
                          "retire the group (wgmma_wait) before touching the accumulator"),
                       related=[wpath],
                       fix=[{"op": "add", "path": self.ks.src_path(path), "value": {"op": "wgmma_wait", "n": 0}}])

    # ------------------------------------------------------------------ race analysis
    def _analyse(self):
        self._analyse_global()
        by_buf: dict = {}
        for a in self.accs:
            by_buf.setdefault(a.buf, []).append(a)
        for buf, lst in by_buf.items():
            lst.sort(key=lambda a: a.start)
            slots: dict = {}
            for a2 in lst:
                seen = set()
                cands = []
                for sl in a2.slots:
                    for a1 in slots.get(sl, ())[-RACE_WINDOW:]:
                        if id(a1) not in seen:
                            seen.add(id(a1))
                            cands.append(a1)
                if len(a2.slots) > 1:
                    cands.sort(key=lambda a: a.start)
                for a1 in cands:
                    if not (a1.write or a2.write):
                        continue
                    ov, xwarp = _overlap(a1, a2)
                    if not ov:
                        continue
                    self._pair(a1, a2, xwarp)
                if a2.kind in ("wgmma", "tma_store"):
                    self._proxy(a2, cands)
                for sl in a2.slots:
                    slots.setdefault(sl, []).append(a2)

    def _pair(self, a1: Acc, a2: Acc, xwarp: bool):
        g = self.g
        if a1.sig is not None and a1.sig == a2.sig and a1.start == a2.start:
            return      # one statement reading and writing its own elements (an accumulating reduce)
        anc2 = g.anc[a2.start]
        same = a1.proc == a2.proc
        if not (anc2 >> a1.end) & 1:
            issue_ordered = g.hb(a1.start, a2.start)
            kind = _hazard(a1, a2)
            found = self._release_between(a1, a2) if a1.kind == "wgmma" and issue_ordered else None
            if found is not None:
                rel, lastwait = found
                if lastwait is not None and not self.ks.expanded(lastwait):
                    fix = [{"op": "replace", "path": lastwait + "/n", "value": 0}]
                else:
                    fix = [{"op": "add", "path": self.ks.insert_point(rel), "value": {"op": "wgmma_wait", "n": 0}}]
                self.issue("E-SYN-07", rel, f"releases the smem slot read by the wgmma at {a1.path} before a "
                           f"wgmma_wait retires it: {a2.path} then overwrites {a1.buf} ({kind}) while the wgmma may "
                           "still read it (wgmma_wait n leaves the n most recent groups running; release the "
                           "previous iteration's stage instead, or wait with n = 0)",
                           related=[a1.path, a2.path] + ([lastwait] if lastwait else []), fix=fix,
                           key=("E-SYN-07", rel))
                return
            if a1.kind == "cp_async" and not a2.write and (issue_ordered or same):
                self._cp_raw(a1, a2, "in flight")
                return
            if same and a1.kind in ("generic", "cp_async") and a2.kind in ("generic", "cp_async"):
                self._intra(a1, a2, kind, ordered=False)
                return
            if a1.kind == "tma_store" and issue_ordered:
                self.issue("E-SYN-10", a2.path, f"overwrites {a1.buf} while the TMA store at {a1.path} may still be "
                           "reading it: wait for the bulk group (tma_store_commit; tma_store_wait) first",
                           related=[a1.path], key=("E-SYN-10", a2.path, a1.path))
                return
            bar = self._barrier_hint(a1, a2)
            who1, who2 = self._who(a1), self._who(a2)
            self.issue("E-SYN-10", a2.path, f"{kind} race on {a1.buf}[slot {_slots(a1, a2)}]: {a2.path} ({who2}) is "
                       f"not ordered after {a1.path} ({who1}) by any barrier (no arrive/complete_tx -> wait chain "
                       f"with a matching phase){_sizes(self)}", related=[a1.path] + bar,
                       key=("E-SYN-10", a2.path, a1.path))
            return
        if not same:
            return
        # ordered in program order of the role: different threads still need a CTA/warp barrier (also
        # between a wgmma and the other threads' cp.async / stores of its operand tile, either way: a
        # wait_group, cp.async's or wgmma's, covers only the waiting threads)
        thread_sync = (a1.kind == "cp_async" and a2.kind == "wgmma") or (
            a1.kind == "wgmma" and a2.write and a2.kind in ("generic", "cp_async"))
        if (a1.kind in ("wgmma", "tma", "tma_store") or a2.kind in ("wgmma", "tma", "tma_store")) and not thread_sync:
            return
        if a1.write and a2.write:
            return
        if a1.single is not None and a1.single == a2.single:
            return
        if a1.sig is not None and a1.sig == a2.sig:
            return
        need = g.cross if xwarp else g.crossw
        if (need[a2.start] >> a1.end) & 1:
            return
        if a1.kind == "cp_async" and not a2.write:
            self._cp_raw(a1, a2, "no barrier")
            return
        self._intra(a1, a2, _hazard(a1, a2), ordered=True)

    def _cp_raw(self, a1: Acc, a2: Acc, why: str):
        wait = a2.info.get("wait")
        if why == "in flight":
            grp = a1.info.get("group")
            msg = (f"reads {a1.buf} (slot {_slots(a1, a2)}) written by the cp.async at {a1.path} before its group is "
                   "complete: ")
            legal = fix = None
            rel = [a1.path]
            if grp is None:
                msg += "the copy is never committed and waited before this read"
            elif wait is None:
                msg += "no cp_async_wait precedes the read"
            else:
                wpath, commits, n = wait
                newer = commits - grp
                rel.append(wpath)
                msg += (f"the cp_async_wait {n} at {wpath} leaves it in flight (wait_group n lets the n most recent "
                        f"groups run; {newer} group(s) were committed after this copy's)")
                if 0 <= newer < n:
                    legal = list(range(0, newer + 1))
                    if not self.ks.expanded(wpath):
                        fix = [{"op": "replace", "path": wpath + "/n", "value": newer}]
            self.issue("E-SYN-06", a2.path, msg + _sizes(self), related=rel, legal=legal, fix=fix,
                       key=("E-SYN-06", a2.path, a1.buf))
        else:
            self.issue("E-SYN-06", a2.path, f"reads {a1.buf} (slot {_slots(a1, a2)}) filled by other threads' "
                       f"cp.async at {a1.path} with no syncthreads/bar_sync after the cp_async_wait: "
                       "wait_group only makes a thread's own copies visible to itself",
                       related=[a1.path] + ([wait[0]] if wait else []),
                       fix=[{"op": "add", "path": sync_insert, "value": {"op": "syncthreads"}}]
                       if (sync_insert := self._after_wait(wait, a2)) else None, key=("E-SYN-06", a2.path, a1.buf))

    def _after_wait(self, wait, a2: Acc) -> Optional[str]:
        """Insertion point for a barrier right after the cp_async_wait (single-role kernels)."""
        if wait is None or len(self.k.roles) != 1:
            return None
        s = self.ks.by_path.get(wait[0])
        if s is None or self.ks.thread_guards(s) or self.ks.expanded(wait[0]):
            return None
        return next_path(wait[0])

    def _collective_fix(self, a2: Acc):
        """A statement that orders the role's threads, inserted before a2 (None if none fits)."""
        if len(self.k.roles) == 1:
            return [{"op": "add", "path": self.ks.insert_point(a2.path), "value": {"op": "syncthreads"}}]
        p = self.procs[a2.proc]
        role = p.sp.role
        if role is None:
            return [{"op": "add", "path": self.ks.insert_point(a2.path), "value": {"op": "syncthreads"}}]
        nb = next((b for b in self.k.barriers if isinstance(b, NamedBarrier) and b.bar_id != 0
                   and b.threads == role.threads), None)
        if nb is None:
            return None
        return [{"op": "add", "path": self.ks.insert_point(a2.path), "value": {"op": "bar_sync", "barrier": nb.name}}]

    def _intra(self, a1: Acc, a2: Acc, kind: str, ordered: bool):
        role = self.procs[a2.proc].sp.name()
        self.issue("E-SYN-11", a2.path, f"{kind} hazard on {a1.buf} (slot {_slots(a1, a2)}) within {role}: "
                   f"threads access elements that other threads {'wrote' if a1.write else 'read'} at {a1.path} "
                   f"with no syncthreads/bar_sync (or syncwarp, within a warp) in between{_sizes(self)}",
                   related=[a1.path], fix=self._collective_fix(a2), key=("E-SYN-11", a2.path, a1.path))

    def _proxy(self, a2: Acc, earlier: list):
        g = self.g
        anc2 = g.anc[a2.start]
        best = None
        for a1 in earlier:
            if not a1.write or not (a1.slots & a2.slots):
                continue
            if not (anc2 >> a1.end) & 1:
                continue
            ov, _ = _overlap(a1, a2)
            if not ov:
                continue
            if best is None or a1.end > best.end:
                best = a1
        if best is None or best.kind not in ("generic", "cp_async"):   # cp.async writes in the generic proxy
            return
        if (g.fenced[a2.start] >> best.end) & 1:
            return
        reader = "TMA store" if a2.kind == "tma_store" else "wgmma"
        self.issue("E-SYN-08", best.path, f"generic-proxy write of {best.buf} is read by the {reader} at {a2.path} "
                   "(async proxy) without a fence proxy_async between them: the async proxy may read stale data",
                   related=[a2.path],
                   fix=[{"op": "add", "path": next_path(self.ks.src_path(best.path)),
                         "value": {"op": "fence", "kind": "proxy_async"}}],
                   key=("E-SYN-08", best.path, a2.path))

    def _release_between(self, a1: Acc, a2: Acc) -> Optional[str]:
        """The arrive of a1's role that released a1's slot (same index) after issuing a1 and before its
        retirement, and that orders a2: the release came too early."""
        p = self.procs[a1.proc]
        for n, path, idx, lastwait in p.arrives:
            if n > a1.start and (idx & a1.slots) and self.g.hb(a1.start, n) and self.g.hb(n, a2.start) \
                    and not self.g.hb(a1.end, n):
                return path, lastwait
        return None

    def _barrier_hint(self, a1: Acc, a2: Acc) -> list:
        out = []
        for a in (a1, a2):
            name = a.info.get("barrier")
            bi = next((i for i, b in enumerate(self.k.barriers) if b.name == name), None) if name else None
            if bi is not None:
                out.append(f"/barriers/{bi}")
        p = self.procs[a2.proc]
        for n, path, name in reversed(p.waits):
            if n < a2.start:
                bi = next((i for i, b in enumerate(self.k.barriers) if b.name == name), None)
                out.append(path)
                if bi is not None:
                    out.append(f"/barriers/{bi}")
                break
        return out

    def _who(self, a: Acc) -> str:
        p = self.procs[a.proc]
        what = {"tma": "TMA / bulk load", "tma_store": "TMA store", "cp_async": "cp.async", "wgmma": "wgmma",
                "generic": "write" if a.write else "read"}[a.kind]
        return f"{what} in {p.sp.name()}"


_CONTROL = (For, If, Block, Let, LastCta)


def _show(expr, env) -> str:
    node = parse_i(expr)
    v = E.try_const(node, env) if node is not None else None
    return str(v) if v is not None else str(expr)


def _slots(a1: Acc, a2: Acc) -> str:
    s = sorted(a1.slots & a2.slots)
    return ",".join(map(str, s[:4]))


def _sizes(sim: Simulator) -> str:
    sz = sim.sizes_shown()
    if not sz:
        return ""
    return " (simulated with " + ", ".join(f"{k}={v}" for k, v in sz.items()) + ")"


def _hazard(a1: Acc, a2: Acc) -> str:
    if a1.write and a2.write:
        return "write-after-write"
    if a1.write:
        return "read-after-write"
    return "write-after-read"


def _ov(r1, r2) -> bool:
    if len(r1) != len(r2):
        return True
    for (x0, x1), (y0, y1) in zip(r1, r2):
        if not (x0 < y1 and y0 < x1):
            return False
    return True


def _overlap(a1: Acc, a2: Acc) -> tuple[bool, bool]:
    """(regions overlap, some overlapping pair is in different warps)."""
    if a1.region.__class__ is tuple and a2.region.__class__ is tuple:
        if not _ov(a1.region, a2.region):
            return False, False
        single = len(a1.warps) == 1 and a1.warps == a2.warps
        return True, not single
    r1 = a1.region if isinstance(a1.region, dict) else {w: a1.region for w in a1.warps}
    r2 = a2.region if isinstance(a2.region, dict) else {w: a2.region for w in a2.warps}
    ov = False
    for w1, x in r1.items():
        for w2, y in r2.items():
            if _ov(x, y):
                ov = True
                if w1 != w2:
                    return True, True
    if ov:
        # same warp only; but if either side spreads its elements over the warp's lanes differently
        # than the other, a syncwarp is enough
        return True, False
    return False, False


def subst_lets_map(node: E.Node, tl: dict) -> E.Node:
    if not tl:
        return node
    for _ in range(8):
        fv = E.free_vars(node) & tl.keys()
        if not fv:
            break
        node = E.substitute(node, {n: tl[n] for n in fv})
    return node


# ------------------------------------------------------------------ symbolic/numeric comparison
def site_samples(kernel: Kernel, site: Site, n_inner: int = 12, max_envs: int = 256) -> list[dict]:
    """Environments for comparing expressions at a site: consts, two samples of the integer params,
    block index 0, and values of the enclosing loop variables (the innermost loop's first `n_inner`
    iterations, the outer loops' first two) with lets evaluated in between."""
    out = []
    for penv in param_samples(kernel):
        base = dict(kernel.consts)
        base.update(penv)
        for axis in "xyz":
            base[f"bid.{axis}"] = 0
            base[f"nbid.{axis}"] = 1
        envs = [base]
        for d, loop in enumerate(site.loops):
            nxt = []
            for env in envs:
                a = E.try_const(parse_i(loop.start) or E.Num(0), env)
                b = E.try_const(parse_i(loop.stop) or E.Num(0), env)
                if not isinstance(a, int):
                    continue
                cnt = n_inner if d == len(site.loops) - 1 else 2
                vals = [a + j * loop.step for j in range(cnt)]
                if isinstance(b, int):
                    vals = [v for v in vals if v < b]
                for v in vals:
                    e2 = dict(env)
                    e2[loop.var] = v
                    nxt.append(e2)
            envs = nxt[:max_envs]
        out.extend(envs)
    # keep only the iterations in which the statement runs (uniform parts of the guards)
    conds = []
    for g in site.guards:
        node = parse_c(g.cond)
        if node is None:
            continue
        node = subst_lets(node, site.lets)
        if g.taken or not is_thread_dep(node):
            conds.append((node, g.taken))
    if conds:
        kept = []
        for env in out:
            ok = True
            for node, taken in conds:
                t = _utruth(node, env)
                if t is not None and t != taken:
                    ok = False
                    break
            if ok:
                kept.append(env)
        out = kept
    return out[:max_envs * 2]


def compare_at_site(kernel: Kernel, site: Site, a, b, n_inner: int = 12) -> Optional[bool]:
    """Are index expressions a and b (text or nodes) equal at this site? True / False (a counterexample
    among the sampled iterations) / None (cannot tell)."""
    na = a if isinstance(a, (E.Num, E.Var, E.Un, E.Bin, E.Call)) else parse_i(a)
    nb = b if isinstance(b, (E.Num, E.Var, E.Un, E.Bin, E.Call)) else parse_i(b)
    if na is None or nb is None:
        return None
    na, nb = subst_lets(na, site.lets), subst_lets(nb, site.lets)
    ca, cb = E.canon(na), E.canon(nb)
    if ca is not None and ca == cb:
        return True
    if is_thread_dep(na) or is_thread_dep(nb):
        return None
    return equal_on_samples(na, nb, site_samples(kernel, site, n_inner))


def _utruth(node, env) -> Optional[bool]:
    """Truth of a condition for counting instances: thread-dependent atoms count as true."""
    if isinstance(node, E.Bin) and node.op in ("&&", "||"):
        a, b = _utruth(node.a, env), _utruth(node.b, env)
        if a is None or b is None:
            return None
        return (a and b) if node.op == "&&" else (a or b)
    if isinstance(node, E.Un) and node.op == "!":
        if is_thread_dep(node.a):
            return True
        a = _utruth(node.a, env)
        return None if a is None else not a
    if is_thread_dep(node):
        return True
    v = E.try_const(node, env)
    return None if v is None else bool(v)


def count_execs(kernel: Kernel, path: str, env: dict, budget: int = 100000) -> Optional[int]:
    """How many times the statement at `path` runs (per executing thread, thread guards taken as true)
    for the given values of consts/params. None when a bound or guard cannot be evaluated."""
    parts = path.strip("/").split("/")
    if parts[0] == "prologue":
        body, rest = kernel.prologue, parts[1:]
    elif parts[0] == "roles" and len(parts) >= 3:
        try:
            body, rest = kernel.roles[int(parts[1])].body, parts[3:]
        except (ValueError, IndexError):
            return None
    else:
        return None
    steps = [0]

    def rec(body, rest, env):
        steps[0] += 1
        if steps[0] > budget:
            raise Unknown("budget")
        i = int(rest[0])
        env = dict(env)
        for st in body[:i]:
            if isinstance(st, Let):
                node = parse_i(st.value)
                v = E.try_const(ld_representative(node), env) if node is not None else None
                if isinstance(v, int):
                    env[st.name] = v
                else:
                    env.pop(st.name, None)
        st = body[i]
        if len(rest) == 1:
            return 1
        field_, sub = rest[1], rest[2:]
        if isinstance(st, For):
            a = E.try_const(parse_i(st.start), env)
            b = E.try_const(parse_i(st.stop), env)
            if not isinstance(a, int) or not isinstance(b, int):
                raise Unknown("bounds")
            tot = 0
            for v in range(a, b, st.step):
                env[st.var] = v
                tot += rec(st.body, sub, env)
            return tot
        if isinstance(st, If):
            node = parse_c(st.cond)
            if node is None:
                raise Unknown("cond")
            if field_ == "else" and is_thread_dep(node):
                t = True
            else:
                t = _utruth(node, env)
                if t is None:
                    raise Unknown("cond")
                if field_ == "else":
                    t = not t
            return rec(st.then if field_ == "then" else st.else_, sub, env) if t else 0
        if isinstance(st, (Block, LastCta)):
            return rec(st.body, sub, env)
        raise Unknown("path")

    try:
        return rec(body, rest, env)
    except (Unknown, ValueError, IndexError, E.ExprError, ZeroDivisionError):
        return None


def exec_env(kernel: Kernel, penv: dict) -> dict:
    env = dict(kernel.consts)
    env.update(penv)
    for axis in "xyz":
        env[f"bid.{axis}"] = 0
        env[f"nbid.{axis}"] = 1
    return env
