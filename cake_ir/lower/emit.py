"""Emit CUDA C++ for an expanded, verified kernel.

One function per statement kind; every emitted statement carries a `// <node path>` comment and an
entry in the line map, so NVRTC/ptxas messages map back to IR nodes. The code calls the runtime
header (cake_ir/runtime/cake.cuh) for every instruction and generates wgmma wrappers per N used.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field, replace
from math import prod
from pathlib import Path
from typing import NamedTuple, Optional

from .. import expr as E
from ..analysis.tiles import bulk_rows, per_thread_elems, resolve_tile, threads_in_scope
from ..analysis.topk import sorted_merge_problems
from ..arch import spec as arch_spec
from ..diagnostics import Diagnostic
from ..dtypes import C_TYPE, SIZE
from ..nodes import (Access, ArriveWait, BarRef, Block, Buffer, Copy, CpAsyncArrive, Fence, Fill, For, If, Kernel,
                     LastCta, Let, Map,
                     BucketOffsets, BucketPlace, OneHot, RedAdd, RowSelect, ScatterAdd, SegmentSums, TopK,
                     TopKBound, TopKMerge,
                     MBarrier, MbarArrive, MbarExpectTx, MbarInit, MbarWait, MmaSync, NamedBarrier, NamedBarSync,
                     PipeOp, Reduce, Role, ScalarParam, Scan, SimpleSync, TensorParam, TileRef, WaitGroup, Wgmma)
from ..passes.plan_smem import SmemPlan, plan_smem, row_pitch_elems
from ..walk import statements
from .writer import SourceTooLarge, Writer, safe_comment

HEADER_PATH = Path(__file__).resolve().parent.parent / "runtime" / "cake.cuh"

STORAGE = {"bf16": "cake::bf16", "f16": "cake::f16", "f32": "float", "f64": "double", "i32": "int",
           "u32": "unsigned", "i64": "long long", "u64": "unsigned long long", "i8": "signed char",
           "u8": "unsigned char", "pred": "bool"}
BUILTIN_C = {"bid.x": "blockIdx.x", "bid.y": "blockIdx.y", "bid.z": "blockIdx.z", "nbid.x": "gridDim.x",
             "nbid.y": "gridDim.y", "nbid.z": "gridDim.z", "tid": "cake_tid", "lane": "cake_lane",
             "warp": "cake_warp", "role_warp": "cake_role_warp", "role_tid": "cake_role_tid", "wg": "cake_wg",
             "wg_tid": "cake_wg_tid"}
SWZ_BITS = {"swizzle_32B": 1, "swizzle_64B": 2, "swizzle_128B": 3}
DESC_SWIZZLE = {"swizzle_128B": 1, "swizzle_64B": 2, "swizzle_32B": 3}


class SumPlan(NamedTuple):
    """A warp (or one-thread) sum ready to emit: `n` source registers per lane, register cake_e adds
    `val` into accumulator row `idx`, `rows` results per lane into `dst`, over `threads` lanes."""
    n: int
    idx: str
    val: str
    rows: int
    dst: Buffer
    threads: int


class LowerError(Exception):
    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


@dataclass
class Lowered:
    source: str
    line_map: dict[int, str]
    kernel_name: str
    signature: list[dict]
    smem_bytes: int
    plan: SmemPlan
    diagnostics: list[Diagnostic] = field(default_factory=list)
    header_lines: int = 0


def header_text() -> str:
    return HEADER_PATH.read_text()


def _var(node: E.Var) -> str:
    return BUILTIN_C.get(node.name, node.name)


def ix(e) -> str:
    """An index expression as C."""
    return E.to_c(E.parse_index(e), _var)


def cond_c(e) -> str:
    if isinstance(e, bool):
        return "true" if e else "false"
    return E.to_c(E.parse_cond(e), _var)


def _robust(fn):
    """Lowering of the newer ops on unverified input: malformed operands become LowerError diagnostics
    (the lowering also runs on programs the verifier rejected), never a crash."""
    import functools

    @functools.wraps(fn)
    def wrapped(self, st, *args):
        path = args[-1]
        try:
            return fn(self, st, *args)
        except (LowerError, E.ExprError, RecursionError, SourceTooLarge):
            raise
        except (IndexError, KeyError, ValueError, TypeError, AttributeError, ZeroDivisionError) as e:
            self.fail(path, f"{getattr(st, 'op', '?')} cannot be lowered: {type(e).__name__}: {e}")
    return wrapped


class Emitter:
    def __init__(self, k: Kernel):
        self.k = k
        self.spec = arch_spec(k.arch)
        self.plan = plan_smem(k)
        self.w = Writer()
        self.role: Optional[Role] = None
        self.role_index: Optional[int] = None
        self.wgmma_ns: set[tuple[int, str]] = set()
        self.wgmma_rs_ns: set[tuple[int, str, int]] = set()   # A from registers: (N, type, trans_b)
        self.diags: list[Diagnostic] = []
        self.uid = 0
        self.cur = "/"  # path of the statement being lowered

    # ------------------------------------------------------------------------- helpers
    def fresh(self, base: str) -> str:
        self.uid += 1
        return f"cake_{base}{self.uid}"

    def fail(self, path: str, msg: str):
        raise LowerError(path, msg)

    def scope_threads(self, scope: str) -> int:
        rt = self.role.threads if self.role is not None else self.k.launch.threads
        return threads_in_scope(scope, rt, self.k.launch.threads)

    def scope_index(self, scope: str) -> str:
        return {"thread": "0", "warp": "cake_lane", "warpgroup": "cake_wg_tid", "role": "cake_role_tid",
                "cta": "cake_tid"}[scope]

    def bar_addr(self, ref: BarRef, path: str) -> str:
        if ref.name not in self.plan.barrier_offsets:
            self.fail(path, f"unknown mbarrier {ref.name!r}")
        off = self.plan.barrier_offsets[ref.name]
        return f"(cake_smem_base + {off}u + 8u * (unsigned)({ix(ref.index)}))"

    def buf(self, name: str, path: str) -> Buffer:
        b = self.k.buffer(name)
        if b is None:
            self.fail(path, f"unknown buffer {name!r}")
        return b

    def smem_byte(self, b: Buffer, slot, row_c: str, col_c: str) -> str:
        """Byte offset from the smem window base of element (row, col) of stage `slot`."""
        if b.name not in self.plan.offsets:  # a reg buffer named where an smem tile belongs
            self.fail(self.cur, f"{b.name!r} is not a shared-memory buffer")
        es = SIZE[b.dtype]
        pitch = row_pitch_elems(b) * es
        inner = f"(unsigned)(({row_c}) * {pitch} + ({col_c}) * {es})"
        if b.layout in SWZ_BITS:
            inner = f"cake::swz<{SWZ_BITS[b.layout]}>({inner})"
        stage = ""
        if b.stages > 1 or slot not in (None, 0, "0"):
            stage = f" + (unsigned)({ix(slot if slot is not None else 0)}) * {self.plan.stage_strides[b.name]}u"
        return f"{self.plan.offsets[b.name]}u{stage} + {inner}"

    def smem_addr(self, b: Buffer, slot, row_c: str, col_c: str) -> str:
        return f"(cake_smem_base + {self.smem_byte(b, slot, row_c, col_c)})"

    def tile_rc(self, t, path) -> tuple[str, str, int, int]:
        """(row offset C, col offset C, rows, cols) of a 2-D view of a tile: leading dims fold into rows."""
        b = t.target
        shape = t.shape
        off = list(t.offset) + [0] * (len(b.shape) - len(t.offset))
        if len(b.shape) == 1:
            return "0", f"({ix(off[0])})", 1, shape[0]
        # fold leading dims: row = ((o0)*d1 + o1)*d2 ...
        row = f"({ix(off[0])})"
        for d in range(1, len(b.shape) - 1):
            row = f"(({row}) * {b.shape[d]} + ({ix(off[d])}))"
        return row, f"({ix(off[-1])})", prod(shape[:-1]), shape[-1]

    def gaddr(self, p: TensorParam, idx: list[str]) -> str:
        """Element offset into a tensor param for a multi-index (C strings), 64-bit."""
        n = len(p.shape)
        if p.strides and len(p.strides) != n:
            self.fail(f"/params/{self.k.params.index(p)}/strides", f"{len(p.strides)} strides for a {n}-d tensor")
        if len(idx) != n:
            self.fail(self.cur, f"a {len(idx)}-d index into the {n}-d tensor {p.name!r}")
        if p.strides:
            strides = [f"(long long)({ix(s)})" for s in p.strides]
        else:
            strides = []
            for d in range(n):
                rest = [f"(long long)({ix(s)})" for s in p.shape[d + 1:]]
                strides.append(" * ".join(rest) if rest else "1")
        terms = []
        for d in range(n):
            terms.append(f"({idx[d]})" if strides[d] == "1" else f"({idx[d]}) * {strides[d]}")
        return " + ".join(terms)

    def reg_count(self, b: Buffer) -> int:
        rt = self.role.threads if self.role is not None else self.k.launch.threads
        n = per_thread_elems(b, rt, self.k.launch.threads)
        if b.layout in ("mma_a", "mma_b"):
            return max(1, n // 2)  # bf16x2 packed in 32-bit registers
        return n

    def reg_ctype(self, b: Buffer) -> str:
        if b.layout in ("mma_a", "mma_b"):
            return "unsigned"
        return STORAGE[b.dtype]

    # ------------------------------------------------------------------------- kernel
    def emit(self) -> Lowered:
        k, w = self.k, self.w
        w.extend_raw(header_text())
        header_lines = len(w.lines)
        w.line("")
        w.line(f"// ---- generated by CAKE from kernel {safe_comment(k.name)} ({k.arch})")
        body = Writer()
        body.depth = 1
        self.w = body
        for name, v in k.consts.items():
            body.line(f"constexpr int {name} = {int(v)};", f"/consts/{name}")
        body.line("const int cake_tid = threadIdx.x;")
        body.line("const int cake_lane = cake_tid & 31;")
        body.line("const int cake_warp = __shfl_sync(0xffffffffu, cake_tid >> 5, 0);")
        body.line("extern __shared__ __align__(1024) unsigned char cake_smem[];")
        body.line("const unsigned cake_smem_base = cake::smem_u32(cake_smem);")
        body.line("(void)cake_lane; (void)cake_warp; (void)cake_smem_base;")
        # prologue runs with CTA-wide role variables
        if k.prologue:
            body.open("")
            body.line("const int cake_role_warp = cake_warp, cake_role_tid = cake_tid;")
            body.line("const int cake_wg = cake_warp >> 2, cake_wg_tid = cake_tid & 127;")
            body.line("(void)cake_role_warp; (void)cake_role_tid; (void)cake_wg; (void)cake_wg_tid;")
            self.stmts(k.prologue, "/prologue")
            body.close()
        for ri, role in enumerate(k.roles):
            self.emit_role(ri, role)
        if any(p.cluster for p in k.pipelines):
            # the peers' multicasts and remote arrivals target this CTA's shared memory until they are done
            body.line("cake::cluster_sync();", "/pipelines")
        self.w = w
        # wgmma wrappers needed by the body
        for n, ty in sorted(self.wgmma_ns):
            self.emit_wgmma_wrapper(n, ty)
        for n, ty, tb in sorted(self.wgmma_rs_ns):
            self.emit_wgmma_rs_wrapper(n, ty, tb)
        params, sig = self.signature()
        lb = f"__launch_bounds__({k.launch.threads}, {k.launch.min_blocks_per_sm})"
        if k.launch.cluster:   # compile-time cluster dims: a plain cuLaunchKernel launches clusters
            lb += f" __cluster_dims__({', '.join(str(c) for c in (list(k.launch.cluster) + [1, 1])[:3])})"
        w.line(f'extern "C" __global__ void {lb} {k.name}(', "/")
        for i, p in enumerate(params):
            w.line(f"    {p}{',' if i < len(params) - 1 else ') {'}")
        if not params:
            w.line("    ) {")
        base = len(w.lines)
        for ln, path in body.line_map.items():
            w.line_map[base + ln] = path
        w.lines.extend(body.lines)
        w.line("}")
        return Lowered(w.text(), w.line_map, k.name, sig, self.plan.total, self.plan, self.diags, header_lines)

    def signature(self) -> tuple[list[str], list[dict]]:
        params, sig = [], []
        for p in self.k.params:
            if isinstance(p, TensorParam):
                const = "const " if p.access == "read" else ""
                params.append(f"{const}{STORAGE[p.dtype]}* __restrict__ {p.name}")
                sig.append({"name": p.name, "kind": "ptr", "dtype": p.dtype})
                if p.tma is not None:
                    params.append(f"const __grid_constant__ cake::TensorMap cake_tmap_{p.name}")
                    sig.append({"name": p.name, "kind": "tmap", "dtype": p.dtype, "box": list(p.tma.box),
                                "swizzle": p.tma.swizzle, "oob_fill": p.tma.oob_fill})
            else:
                params.append(f"{ {'i32': 'int', 'u32': 'unsigned', 'i64': 'long long', 'f32': 'float'}[p.dtype]} {p.name}")
                sig.append({"name": p.name, "kind": "scalar", "dtype": p.dtype})
        return params, sig

    def emit_role(self, ri: int, role: Role):
        w = self.w
        self.role, self.role_index = role, ri
        a, n = role.warps
        w.open(f"if (cake_warp >= {a} && cake_warp < {a + n})", f"/roles/{ri}")
        if role.regs is not None and self.k.arch == "sm_90a":
            cap = self.entry_reg_cap()
            fn = "inc" if role.regs > cap else "dec"
            w.line(f"cake::setmaxnreg_{fn}<{role.regs}>();", f"/roles/{ri}/regs")
        w.line(f"const int cake_role_warp = cake_warp - {a};")
        w.line(f"const int cake_role_tid = cake_tid - {a * 32};")
        w.line("const int cake_wg = cake_role_warp >> 2;")
        w.line("const int cake_wg_tid = cake_role_tid & 127;")
        w.line("(void)cake_role_warp; (void)cake_role_tid; (void)cake_wg; (void)cake_wg_tid;")
        for bi, b in enumerate(self.k.buffers):
            if b.space == "reg" and (b.role == role.name or (b.role is None and self._role_uses(role, b.name))):
                w.line(f"{self.reg_ctype(b)} {b.name}[{self.reg_count(b)}];", f"/buffers/{bi}")
        self.stmts(role.body, f"/roles/{ri}/body")
        w.close()
        self.role = None

    def entry_reg_cap(self) -> int:
        per = 65536 // (self.k.launch.threads * self.k.launch.min_blocks_per_sm)
        return min(255, per // 8 * 8)

    def _role_uses(self, role: Role, name: str) -> bool:
        from ..walk import _walk_body
        for s in _walk_body(role.body, "", role, 0, (), (), (), (), None):
            for f in ("src", "dst", "a", "b", "c", "acc", "vals", "idx", "src_idx", "index", "queue_vals", "queue_idx"):
                t = getattr(s.node, f, None)
                if isinstance(t, TileRef) and t.buf == name:
                    return True
            if isinstance(s.node, Map) and name in E.free_vars(E.parse_value(s.node.expr)):
                return True
        return False

    # ------------------------------------------------------------------------- statements
    def stmts(self, body, path):
        i = 0
        while i < len(body):
            st, nxt = body[i], body[i + 1] if i + 1 < len(body) else None
            pair = self.fusable_sums(st, nxt, f"{path}/{i}")
            if pair:   # two adjacent independent warp sums share one shuffle tree
                self.cur = f"{path}/{i}"
                self.emit_sums(pair, f"{path}/{i}")
                i += 2
                continue
            self.stmt(st, f"{path}/{i}")
            i += 1

    def stmt(self, st, path):
        w = self.w
        self.cur = path  # the statement being lowered, for helpers' diagnostics
        if st.note:
            w.line(f"// {safe_comment(st.note)}")
        m = getattr(self, f"s_{type(st).__name__}", None)
        if m is None:
            self.fail(path, f"lowering has no rule for {type(st).__name__}")
        m(st, path)

    def s_For(self, st: For, path):
        w = self.w
        if st.unroll is True:
            w.line("#pragma unroll")
        elif st.unroll is False:
            pass
        else:
            w.line(f"#pragma unroll {int(st.unroll)}")
        w.open(f"for (int {st.var} = {ix(st.start)}; {st.var} < {ix(st.stop)}; {st.var} += {st.step})", path)
        self.stmts(st.body, path + "/body")
        w.close()

    def s_If(self, st: If, path):
        w = self.w
        w.open(f"if ({cond_c(st.cond)})", path)
        self.stmts(st.then, path + "/then")
        if st.else_:
            w.depth -= 1
            w.line("} else {", path + "/else")
            w.depth += 1
            self.stmts(st.else_, path + "/else")
        w.close()

    def s_Let(self, st: Let, path):
        self.w.line(f"const int {st.name} = {ix(st.value)};", path)

    def s_Block(self, st: Block, path):
        self.w.open("", path)
        self.stmts(st.body, path + "/body")
        self.w.close()

    def s_PipeOp(self, st: PipeOp, path):
        self.fail(path, f"{st.op} was not expanded (unknown pipeline {st.pipe!r}?)")

    # ---- sync
    def s_MbarInit(self, st: MbarInit, path):
        self.w.line(f"cake::mbar_init({self.bar_addr(st.barrier, path)}, {st.arrivals}u);", path)

    def s_MbarArrive(self, st: MbarArrive, path):
        if st.cluster:
            self.w.line(f"for (unsigned cake_cta = 0; cake_cta < {self.cluster_size()}u; ++cake_cta) "
                        f"cake::mbar_arrive_cluster({self.bar_addr(st.barrier, path)}, cake_cta);", path)
            return
        self.w.line(f"cake::mbar_arrive({self.bar_addr(st.barrier, path)});", path)

    def cluster_size(self) -> int:
        n = 1
        for c in self.k.launch.cluster or [1]:
            n *= c
        return n

    def s_MbarExpectTx(self, st: MbarExpectTx, path):
        self.w.line(f"cake::mbar_expect_tx({self.bar_addr(st.barrier, path)}, {st.bytes}u);", path)

    def s_MbarWait(self, st: MbarWait, path):
        self.w.line(f"cake::mbar_wait({self.bar_addr(st.barrier, path)}, (unsigned)({ix(st.parity)}));", path)

    def s_CpAsyncArrive(self, st: CpAsyncArrive, path):
        self.w.line(f"cake::cp_async_arrive({self.bar_addr(st.barrier, path)});", path)

    def s_SimpleSync(self, st: SimpleSync, path):
        c = {"cp_async_commit": "cake::cp_async_commit();", "wgmma_fence": "cake::wgmma_fence();",
             "wgmma_commit": "cake::wgmma_commit();", "syncthreads": "__syncthreads();",
             "syncwarp": "__syncwarp();", "tma_store_commit": "cake::tma_store_commit();",
             "cluster_sync": "cake::cluster_sync();"}[st.op]
        if st.op == "wgmma_fence":
            self.fence_accumulators(path)
        self.w.line(c, path)

    def s_WaitGroup(self, st: WaitGroup, path):
        fn = {"cp_async_wait": "cp_async_wait", "wgmma_wait": "wgmma_wait", "tma_store_wait": "tma_store_wait"}[st.op]
        self.w.line(f"cake::{fn}<{st.n}>();", path)
        if st.op == "wgmma_wait":
            self.fence_accumulators(path)

    def fence_accumulators(self, path):
        """Pin wgmma accumulators so the compiler neither reads them before the wait nor moves
        writes past the fence (asynchronous wgmma owns them in between)."""
        if self.role is None:
            return
        for b in self.k.buffers:
            if b.space == "reg" and b.layout == "wgmma_acc" and (b.role in (None, self.role.name)) \
                    and self._role_uses(self.role, b.name):
                n = self.reg_count(b)
                self.w.line(f"#pragma unroll")
                self.w.line(f"for (int cake_i = 0; cake_i < {n}; ++cake_i) cake::reg_fence({b.name}[cake_i]);", path)

    def s_NamedBarSync(self, st: NamedBarSync, path):
        b = self.k.barrier(st.barrier)
        if not isinstance(b, NamedBarrier):
            self.fail(path, f"{st.barrier!r} is not a named barrier")
        fn = "bar_sync" if st.op == "bar_sync" else "bar_arrive"
        self.w.line(f"cake::{fn}({b.bar_id}, {b.threads});", path)

    def s_Fence(self, st: Fence, path):
        c = {"proxy_async": "cake::fence_proxy_async();", "mbarrier_init": "cake::fence_mbarrier_init();",
             "acq_rel_cta": "cake::fence_acq_rel_cta();", "acq_rel_gpu": "cake::fence_acq_rel_gpu();"}[st.kind]
        self.w.line(c, path)

    # ---- copies
    def s_Copy(self, st: Copy, path):
        src, dst = resolve_tile(self.k, st.src), resolve_tile(self.k, st.dst)
        if not src.known or not dst.known:
            self.fail(path, "copy names an unknown buffer or tensor")
        if st.kind == "tma_load":
            p, b = src.param, dst.buffer
            if p is None or p.tma is None or b is None:
                self.fail(path, "tma_load copies a tma tensor param into an smem buffer")
            coords = [f"(int)({ix(o)})" for o in reversed(src.offset)]
            rank = len(coords)
            if rank > 3:
                self.fail(path, "tma_load supports rank 1-3")
            row, col, _, _ = self.tile_rc(dst, path)
            addr = self.smem_addr(b, st.dst.slot, row, col)
            if st.barrier is None:
                self.fail(path, "tma_load needs a barrier")
            if st.multicast:
                mask = (1 << self.cluster_size()) - 1
                self.w.line(f"cake::tma_load_{rank}d_mc({addr}, &cake_tmap_{p.name}, {', '.join(coords)}, "
                            f"{self.bar_addr(st.barrier, path)}, (unsigned short){mask}u);", path)
                return
            self.w.line(f"cake::tma_load_{rank}d({addr}, &cake_tmap_{p.name}, {', '.join(coords)}, "
                        f"{self.bar_addr(st.barrier, path)});", path)
            return
        if st.kind == "tma_store":
            p, b = dst.param, src.buffer
            if p is None or p.tma is None or b is None:
                self.fail(path, "tma_store copies an smem buffer into a tma tensor param")
            coords = [f"(int)({ix(o)})" for o in reversed(dst.offset)]
            row, col, _, _ = self.tile_rc(src, path)
            self.w.line(f"cake::tma_store_{len(coords)}d(&cake_tmap_{p.name}, {self.smem_addr(b, st.src.slot, row, col)}, "
                        f"{', '.join(coords)});", path)
            return
        # cooperative cp_async / sync / bulk_load: global -> smem
        p, b = src.param, dst.buffer
        if p is None or b is None or b.space != "smem":
            self.fail(path, f"{st.kind} copies a global tensor tile into an smem buffer")
        shape = dst.shape
        if len(src.offset) != len(shape):  # the dst's rows unravel into the src's leading dims
            self.fail(path, f"{st.kind} copies between tiles of equal rank ({len(src.offset)}-d src, {len(shape)}-d dst)")
        if st.kind == "bulk_load":
            return self.bulk_load(st, src, dst, p, b, shape, path)
        es = SIZE[b.dtype]
        V = st.vec_bytes // es
        if V < 1 or shape[-1] % V:
            self.fail(path, f"tile inner extent {shape[-1]} is not a multiple of {st.vec_bytes} bytes")
        C = shape[-1]
        CR = C // V
        R = prod(shape[:-1])
        total = R * CR
        T = self.scope_threads(st.scope)
        iters = math.ceil(total / T)
        t = self.scope_index(st.scope)
        drow, dcol, _, _ = self.tile_rc(dst, path)
        w = self.w
        w.line("#pragma unroll")
        w.open(f"for (int cake_i = 0; cake_i < {iters}; ++cake_i)", path)
        w.line(f"const int cake_q = cake_i * {T} + {t};")
        guard = total % T != 0
        if guard:
            w.open(f"if (cake_q < {total})")
        w.line(f"const int cake_r = cake_q / {CR}, cake_c = (cake_q % {CR}) * {V};")
        # global multi-index: leading tile dims unravel cake_r
        gidx = self._unravel_rows(src, "cake_r", "cake_c", shape)
        goff = self.gaddr(p, gidx)
        saddr = self.smem_addr(b, st.dst.slot, f"{drow} + cake_r", f"{dcol} + cake_c")
        if st.kind == "cp_async":
            valid = ""
            if st.oob == "zfill":
                conds = [f"({g}) < ({ix(dim)})" for g, dim in zip(gidx, p.shape)]
                valid = ", " + " && ".join(conds)
            w.line(f"cake::cp_async{st.vec_bytes}({saddr}, {p.name} + ({goff}){valid});", path)
        else:
            vt = {16: "uint4", 8: "uint2", 4: "unsigned"}[st.vec_bytes]
            w.line(f"*reinterpret_cast<{vt}*>(cake_smem + ({self.smem_byte(b, st.dst.slot, f'{drow} + cake_r', f'{dcol} + cake_c')})) = "
                   f"*reinterpret_cast<const {vt}*>({p.name} + ({goff}));", path)
        if guard:
            w.close()
        w.close()

    def bulk_load(self, st: Copy, src, dst, p: TensorParam, b: Buffer, shape, path):
        """One cp.async.bulk per tile row (the last dim's run), or one for the whole tile when its rows
        are one run in both memories (analysis.tiles.bulk_rows), dealt round-robin to the scope's
        threads, each completing its bytes on the barrier."""
        if st.barrier is None:
            self.fail(path, "bulk_load needs a barrier (its bytes complete as transactions on it)")
        if b.layout != "row_major":
            self.fail(path, f"bulk_load writes plain rows: {b.name!r} is {b.layout}")
        plan = bulk_rows(self.k, st.src, st.dst)
        if plan is None or plan.copy_bytes % 16:
            self.fail(path, f"bulk_load copies are {plan and plan.copy_bytes} bytes, not a multiple of 16")
        row_bytes, R = plan.copy_bytes, plan.copies
        T = self.scope_threads(st.scope)
        t = self.scope_index(st.scope)
        drow, dcol, _, _ = self.tile_rc(dst, path)
        goff = self.gaddr(p, self._unravel_rows(src, "cake_r", "0", shape))
        saddr = self.smem_addr(b, st.dst.slot, f"{drow} + cake_r", dcol)
        w = self.w
        w.line("#pragma unroll")
        w.open(f"for (int cake_r = {t}; cake_r < {R}; cake_r += {T})", path)
        w.line(f"cake::bulk_load({saddr}, {p.name} + ({goff}), {row_bytes}u, {self.bar_addr(st.barrier, path)});",
               path)
        w.close()

    def _unravel_rows(self, t, r: str, c: str, shape) -> list[str]:
        """Global index per dim of a tile whose leading dims are folded into row `r`."""
        off = list(t.offset)
        n = len(shape)
        idx = []
        for d in range(n - 1):
            inner = prod(shape[d + 1:-1])
            part = f"({r} / {inner})" if inner > 1 else r
            if d > 0:
                part = f"({part} % {shape[d]})"
            idx.append(f"{ix(off[d])} + {part}")
        idx.append(f"{ix(off[-1])} + {c}")
        return idx

    # ---- register tile access
    def s_Access(self, st: Access, path):
        if st.op == "ldmatrix":
            return self.ldmatrix(st, path)
        src, dst = resolve_tile(self.k, st.src), resolve_tile(self.k, st.dst)
        if not src.known or not dst.known:
            self.fail(path, "access names an unknown buffer or tensor")
        reg, mem = (dst, src) if st.op in ("ldg", "lds") else (src, dst)
        if st.row_limit is not None and (st.op != "stg" or mem.space != "global"):
            self.fail(path, "row_limit bounds the rows an stg writes to a global tile")
        rb = reg.buffer
        if rb is None or rb.space != "reg":
            self.fail(path, f"{st.op} moves a register tile")
        if rb.layout == "mma_acc" and st.op == "lds" and not st.trans and mem.dtype == "f32" and rb.dtype == "f32" \
                and st.vec_bytes >= 8 and mem.buffer.layout not in SWZ_BITS:
            return self.load_acc_pairs(rb, mem, path)
        if rb.layout == "mma_acc" and (st.op in ("ldg", "lds") or (st.op == "stg" and st.trans)):
            return self.acc_elementwise(st, rb, mem, path)
        if rb.layout in ("wgmma_acc", "mma_acc") and st.op in ("stg", "sts"):
            if st.trans:
                self.fail(path, "a transposed accumulator store goes to global memory (stg) from an mma_acc tile")
            return self.store_acc(st, rb, reg, mem, path)
        if rb.layout == "mma_rows":
            if st.op in ("ldg", "lds"):
                return self.load_rows(st, rb, mem, path)
            return self.store_rows(st, rb, mem, path)
        if rb.layout not in ("blocked", "row_major"):
            self.fail(path, f"{st.op} of a {rb.layout} tile is not supported (use blocked, or stg from an accumulator)")
        return self.blocked_access(st, rb, reg, mem, path)

    def blocked_access(self, st: Access, rb: Buffer, reg, mem, path):
        w = self.w
        shape = list(rb.shape)
        if reg.offset and any(str(o) != "0" for o in reg.offset):
            self.fail(path, "blocked register tiles are accessed whole (offset 0)")
        V = rb.vec if rb.layout == "blocked" else shape[-1]
        T = self.scope_threads(rb.scope) if rb.layout == "blocked" else 1
        t = self.scope_index(rb.scope) if rb.layout == "blocked" else "0"
        n = prod(shape)
        if n % (T * V):
            self.fail(path, f"tile of {n} elements does not split into {T} threads x {V}-element chunks")
        S = n // (T * V)
        C = shape[-1]
        if C % V:
            self.fail(path, f"inner extent {C} is not a multiple of vec {V}")
        mdt = mem.dtype
        mes, res = SIZE[mdt], SIZE[rb.dtype]
        load = st.op in ("ldg", "lds")
        w.line("#pragma unroll")
        w.open(f"for (int cake_s = 0; cake_s < {S}; ++cake_s)", path)
        w.line(f"const int cake_f = (cake_s * {T} + {t}) * {V};")
        w.line(f"const int cake_r = cake_f / {C}, cake_c = cake_f % {C};")
        if mem.space == "global":
            p = mem.param
            idx = self._unravel_rows(mem, "cake_r", "cake_c", shape) if len(p.shape) == len(shape) else None
            if idx is None:
                self.fail(path, "tile rank must equal the tensor's rank")
            ptr = f"({p.name} + ({self.gaddr(p, idx)}))"
            cptr_t = STORAGE[mdt]
        else:
            b = mem.buffer
            row, col, _, _ = self.tile_rc(mem, path)
            ptr = f"reinterpret_cast<{'const ' if load else ''}{STORAGE[mdt]}*>(cake_smem + ({self.smem_byte(b, mem.ref.slot, f'{row} + cake_r', f'{col} + cake_c')}))"
            cptr_t = STORAGE[mdt]
        chunk_bytes = V * mes
        vb = min(st.vec_bytes, chunk_bytes)
        vt = {16: "uint4", 8: "uint2", 4: "unsigned", 2: "unsigned short"}[vb]
        per = vb // mes  # memory elements per vector
        pieces = chunk_bytes // vb
        conv_in = {"bf16": "cake::bf2f", "f16": "cake::h2f"}.get(mdt, "")
        conv_out = {"bf16": "cake::f2bf", "f16": "cake::f2h"}.get(mdt, "")
        mask = st.oob in ("mask", "zfill") and mem.space == "global"
        guard = ""
        if mask:
            p = mem.param
            idx = self._unravel_rows(mem, "cake_r", "cake_c", shape)
            guard = " && ".join(f"({g}) < ({ix(dim)})" for g, dim in zip(idx, p.shape))
        if st.row_limit is not None:
            first = self._unravel_rows(mem, "cake_r", "cake_c", shape)[0]
            guard = " && ".join(x for x in (guard, f"({first}) < (int)({ix(st.row_limit)})") if x)
            mask = True
        for pc in range(pieces):
            w.open("")
            if load:
                w.line(f"{vt} cake_v;")
                if mask:
                    w.line(f"if ({guard}) cake_v = *reinterpret_cast<const {vt}*>({ptr} + {pc * per}); else cake_v = {vt if ' ' not in vt else ''}{{}};", path)
                else:
                    w.line(f"cake_v = *reinterpret_cast<const {vt}*>({ptr} + {pc * per});", path)
                w.line(f"const {cptr_t}* cake_h = reinterpret_cast<const {cptr_t}*>(&cake_v);")
                for j in range(per):
                    e = f"cake_s * {V} + {pc * per + j}"
                    if mdt == rb.dtype:
                        w.line(f"{rb.name}[{e}] = cake_h[{j}];")
                    elif rb.dtype == "f32":
                        w.line(f"{rb.name}[{e}] = {conv_in}(cake_h[{j}]);")
                    else:
                        w.line(f"{rb.name}[{e}] = {self.to_storage(rb.dtype, self.from_storage(mdt, f'cake_h[{j}]'))};")
            else:
                w.line(f"{vt} cake_v;")
                w.line(f"{cptr_t}* cake_h = reinterpret_cast<{cptr_t}*>(&cake_v);")
                for j in range(per):
                    e = f"cake_s * {V} + {pc * per + j}"
                    if mdt == rb.dtype:
                        w.line(f"cake_h[{j}] = {rb.name}[{e}];")
                    else:
                        w.line(f"cake_h[{j}] = {self.to_storage(mdt, self.from_storage(rb.dtype, f'{rb.name}[{e}]'))};")
                store = f"*reinterpret_cast<{vt}*>({ptr} + {pc * per}) = cake_v;"
                w.line(f"if ({guard}) {store}" if mask else store, path)
            w.close()
        w.close()

    @staticmethod
    def from_storage(dtype: str, x: str) -> str:
        """A stored element as a float expression (an f32 element is one already)."""
        return {"bf16": f"cake::bf2f({x})", "f16": f"cake::h2f({x})", "f32": x}.get(dtype, f"(float)({x})")

    @staticmethod
    def to_storage(dtype: str, x: str) -> str:
        return {"bf16": f"cake::f2bf({x})", "f16": f"cake::f2h({x})", "f32": f"({x})"}.get(dtype, f"({STORAGE[dtype]})({x})")

    def acc_coords(self, N: int):
        """cake_row / cake_col of element cake_e of this lane in an mma_acc tile [M, N]: e = (m-tile *
        n-tiles + n-tile) * 4 + r holds row g (+ 8 for r >= 2), column 2 t (+ 1 for odd r)."""
        self.w.line(f"const int cake_row = ((cake_e >> 2) / {N // 8}) * 16 + (cake_lane >> 2) + ((cake_e & 3) >> 1) * 8;")
        self.w.line(f"const int cake_col = ((cake_e >> 2) % {N // 8}) * 8 + (cake_lane & 3) * 2 + (cake_e & 1);")

    def acc_elementwise(self, st: Access, rb: Buffer, mem, path):
        """ldg / lds into an mma_acc tile, or stg from it with `trans`: one element at a time, each to /
        from its place in a tile whose leading dims fold into rows -- transposed with `trans` (an initial
        state in [V, K] order loaded as S [K, V], the final state stored back that way); from shared
        memory, a matrix assembled there (explicit Gram blocks joining a tensor-core product)."""
        TM, TN = rb.shape
        shape = list(mem.shape)
        rows, cols = (TN, TM) if st.trans else (TM, TN)
        if len(shape) < 2 or prod(shape[:-1]) != rows or shape[-1] != cols:
            self.fail(path, f"an mma_acc [{TM}, {TN}]{' (trans)' if st.trans else ''} moves to / from a tile of "
                      f"{rows} rows x {cols} ({shape})")
        r_c, c_c = ("cake_col", "cake_row") if st.trans else ("cake_row", "cake_col")
        conds = []
        if mem.space == "smem":
            r0, c0, _, _ = self.tile_rc(mem, path)
            val = self.smem_value(mem.buffer, mem.ref.slot, f"{r0} + {r_c}", f"{c0} + {c_c}")
        else:
            p = mem.param
            idx = self._unravel_rows(mem, r_c, c_c, shape)
            if st.oob in ("mask", "zfill"):
                conds += [f"({g}) < ({ix(d)})" for g, d in zip(idx, p.shape)]
            if st.row_limit is not None:
                conds.append(f"({idx[0]}) < (int)({ix(st.row_limit)})")
            elem = f"{p.name}[{self.gaddr(p, idx)}]"
            val = self.from_storage(p.dtype, elem)
        w = self.w
        w.open("", path)
        w.line("#pragma unroll")
        w.open(f"for (int cake_e = 0; cake_e < {self.reg_count(rb)}; ++cake_e)")
        self.acc_coords(TN)
        if st.op in ("ldg", "lds"):
            if conds:
                val = f"(({' && '.join(conds)}) ? {val} : 0.0f)"
            w.line(f"{rb.name}[cake_e] = {val};", path)
        else:
            store = f"{elem} = {self.to_storage(p.dtype, f'{rb.name}[cake_e]')};"
            w.line(f"if ({' && '.join(conds)}) {store}" if conds else store, path)
        w.close()
        w.close()

    def load_acc_pairs(self, rb: Buffer, mem, path):
        """lds of an f32 mma_acc tile from an f32 row-major smem tile (an accumulator kept in shared memory
        between products, e.g. the k-means sums): a lane's pairs (row, 2t..2t+1) as float2 loads (vec_bytes
        >= 8: the pairs are 8-byte aligned), the mirror of the accumulator store. One base pointer, then
        constant element offsets: they fold into the loads' immediates (an unsigned byte offset added per
        element would not: its wrap-around is defined). Swizzled tiles load element by element."""
        TM, TN = rb.shape
        shape = list(mem.shape)
        if len(shape) < 2 or prod(shape[:-1]) != TM or shape[-1] != TN or TM % 16 or TN % 8:
            self.fail(path, f"an mma_acc [{TM}, {TN}] loads from a tile of {TM} rows x {TN} ({shape})")
        r0, c0, _, _ = self.tile_rc(mem, path)
        b = mem.buffer
        w = self.w
        w.open("", path)
        w.line(f"const float* cake_accp = reinterpret_cast<const float*>(cake_smem + ({self.smem_byte(b, mem.ref.slot, r0, c0)}));")
        w.line("#pragma unroll")
        w.open(f"for (int cake_e = 0; cake_e < {self.reg_count(rb)}; cake_e += 2)")
        self.acc_coords(TN)
        w.line(f"const float2 cake_v = *reinterpret_cast<const float2*>(cake_accp + cake_row * {row_pitch_elems(b)} + cake_col);")
        w.line(f"{rb.name}[cake_e] = cake_v.x; {rb.name}[cake_e + 1] = cake_v.y;", path)
        w.close()
        w.close()

    def smem_value(self, b: Buffer, slot, row_c: str, col_c: str) -> str:
        """Element (row, col) of an smem buffer's 2-d view (stage `slot`) as a float expression."""
        ptr = f"reinterpret_cast<const {STORAGE[b.dtype]}*>(cake_smem + ({self.smem_byte(b, slot, row_c, col_c)}))"
        return self.from_storage(b.dtype, f"(*{ptr})")

    def store_acc(self, st: Access, rb: Buffer, reg, mem, path):
        """Store an mma/wgmma accumulator fragment: each thread owns pairs (row, 2c..2c+1)."""
        w = self.w
        if len(rb.shape) != 2 or len(mem.offset) < 2:
            self.fail(path, "an accumulator store moves a 2-d fragment into a tile of at least 2 dims")
        TM, TN = rb.shape[0], rb.shape[1]
        if rb.layout == "wgmma_acc":
            rows_base = "16 * (cake_wg_tid >> 5) + (cake_lane >> 2)"
            mtiles = TM // 64
        else:
            rows_base = "(cake_lane >> 2)"
            mtiles = TM // 16
        ntiles = TN // 8
        mdt = mem.dtype
        fold = mem.space == "global" and mem.shape and len(mem.shape) > 2   # [TM, 1, .., TN]: rows -> dim 0
        if fold and (prod(mem.shape[:-1]) != TM or mem.shape[-1] != TN):
            self.fail(path, f"an accumulator [{TM}, {TN}] stores into a tile of {TM} rows x {TN} ({list(mem.shape)})")

        def gidx(r, c):
            if fold:
                return self._unravel_rows(mem, f"({r})", f"({c})", list(mem.shape))
            return [ix(o) for o in off[:-2]] + [f"{ix(off[-2])} + {r}", f"{ix(off[-1])} + {c}"]
        if mem.space == "global":
            p = mem.param
            off = list(mem.offset)

            def ptr(r, c):
                return f"({p.name} + ({self.gaddr(p, gidx(r, c))}))"
        else:
            b = mem.buffer
            row, col, _, _ = self.tile_rc(mem, path)

            def ptr(r, c):
                return (f"reinterpret_cast<{STORAGE[mdt]}*>(cake_smem + ({self.smem_byte(b, mem.ref.slot, f'{row} + {r}', f'{col} + {c}')}))")
        step_m = 64 if rb.layout == "wgmma_acc" else 16
        w.open("", path)
        w.line(f"const int cake_r0 = {rows_base};")
        w.line(f"const int cake_c0 = 2 * (cake_lane & 3);")
        w.line("#pragma unroll")
        w.open(f"for (int cake_m = 0; cake_m < {mtiles}; ++cake_m)")
        w.line("#pragma unroll")
        w.open(f"for (int cake_n = 0; cake_n < {ntiles}; ++cake_n)")
        w.line(f"const int cake_e = (cake_m * {ntiles} + cake_n) * 4;")
        for half in (0, 1):
            r = f"cake_m * {step_m} + cake_r0 + {8 * half}"
            c = "cake_n * 8 + cake_c0"
            # the fragment's elements as floats: a bf16 / f16 register tile holds raw 16-bit storage
            a0, a1 = (self.from_storage(rb.dtype, f"{rb.name}[cake_e + {2 * half + i}]") for i in (0, 1))
            if mdt == "bf16":
                val, vt = f"cake::pack_bf16x2({a0}, {a1})", "unsigned"
            elif mdt == "f16":
                val, vt = f"cake::pack_f16x2({a0}, {a1})", "unsigned"
            elif mdt == "f32":
                val, vt = f"make_float2({a0}, {a1})", "float2"
            else:
                self.fail(path, f"accumulator store to {mdt} is not supported")
            conds = []
            if st.oob in ("mask", "zfill") and mem.space == "global":
                p = mem.param
                conds += [f"({g}) < ({ix(d)})" for g, d in zip(gidx(r, c), p.shape)]
            if st.row_limit is not None:
                conds.append(f"({gidx(r, c)[0]}) < (int)({ix(st.row_limit)})")
            if conds:
                w.line(f"if ({' && '.join(conds)}) *reinterpret_cast<{vt}*>({ptr(r, c)}) = {val};", path)
            else:
                w.line(f"*reinterpret_cast<{vt}*>({ptr(r, c)}) = {val};", path)
        w.close()
        w.close()
        w.close()

    def ldmatrix(self, st: Access, path):
        src, dst = resolve_tile(self.k, st.src), resolve_tile(self.k, st.dst)
        sb, db = src.buffer, dst.buffer
        if sb is None or db is None or sb.space != "smem" or db.layout not in ("mma_a", "mma_b"):
            self.fail(path, "ldmatrix loads an smem tile into an mma_a / mma_b fragment")
        if len(src.shape) > 2 and all(d == 1 or d == sb.shape[i + 1] for i, d in enumerate(src.shape[1:-1])):
            # an n-d smem tile is its 2-d view (leading dims folded into rows, as tile_rc addresses them)
            src = replace(src, shape=(prod(src.shape[:-1]), src.shape[-1]))
        if len(src.shape) != 2 or len(db.shape) != 2:
            self.fail(path, "ldmatrix tiles and fragment buffers are 2-d (or n-d smem tiles whose middle dims "
                            "are 1 or whole)")
        if st.trans:
            return (self.ldmatrix_trans_b if db.layout == "mma_b" else self.ldmatrix_trans_a)(st, sb, db, src, dst, path)
        R, K = src.shape[-2], src.shape[-1]
        row, col, _, _ = self.tile_rc(src, path)
        fo = self.fragment_offsets(dst, path)
        w = self.w
        KTd = db.shape[1] // 16
        w.open("", path)
        if db.layout == "mma_a":
            if R % 16 or K % 16:
                self.fail(path, "mma_a tiles are multiples of 16x16")
            w.line("const int cake_lr = cake_lane & 15, cake_lc = (cake_lane >> 4) * 8;")
            for mt in range(R // 16):
                for kt in range(K // 16):
                    addr = self.smem_addr(sb, st.src.slot, f"{row} + {mt * 16} + cake_lr", f"{col} + {kt * 16} + cake_lc")
                    e = ((fo[0] // 16 + mt) * KTd + fo[1] // 16 + kt) * 4
                    w.line(f"cake::ldmatrix_x4({addr}, {db.name}[{e}], {db.name}[{e + 1}], {db.name}[{e + 2}], {db.name}[{e + 3}]);", path)
        else:
            if R % 8 or K % 16:
                self.fail(path, "mma_b tiles are [8n, 16k]")
            w.line("const int cake_lr = (cake_lane & 7) + ((cake_lane >> 4) << 3), cake_lc = ((cake_lane >> 3) & 1) * 8;")
            for kt in range(K // 16):
                for np_ in range(R // 16):
                    addr = self.smem_addr(sb, st.src.slot, f"{row} + {np_ * 16} + cake_lr", f"{col} + {kt * 16} + cake_lc")
                    e0 = ((fo[0] // 8 + 2 * np_) * KTd + fo[1] // 16 + kt) * 2
                    e1 = ((fo[0] // 8 + 2 * np_ + 1) * KTd + fo[1] // 16 + kt) * 2
                    w.line(f"cake::ldmatrix_x4({addr}, {db.name}[{e0}], {db.name}[{e0 + 1}], {db.name}[{e1}], {db.name}[{e1 + 1}]);", path)
                if R % 16:
                    nt = R // 8 - 1
                    addr = self.smem_addr(sb, st.src.slot, f"{row} + {nt * 8} + (cake_lane & 7)",
                                          f"{col} + {kt * 16} + ((cake_lane >> 3) & 1) * 8")
                    e0 = ((fo[0] // 8 + nt) * KTd + fo[1] // 16 + kt) * 2
                    w.line(f"cake::ldmatrix_x2({addr}, {db.name}[{e0}], {db.name}[{e0 + 1}]);", path)
        w.close()

    def fragment_offsets(self, t, path) -> list[int]:
        """The constant (row, column) offset of a fragment tile inside its fragment buffer."""
        fo = [E.try_const(E.parse_index(o), dict(self.k.consts)) for o in (t.offset or (0, 0))]
        if any(not isinstance(o, int) for o in fo):
            self.fail(path, "fragment offsets must be constants")
        return fo

    def ldmatrix_trans_b(self, st, sb, db, src, dst, path):
        """B stored [K, N] (row k: its N columns), as a product's right factor usually is (S in W S,
        L in L L): ldmatrix.trans hands lane l the pair (k = 2 (l % 4) + {0, 1}, n = l / 4) of each 8x8
        block, the m16n8k16 B fragment. Lanes 8i..8i+7 address the rows of block i: blocks 0/1 are
        k 0-7 / 8-15 of n-tile 0, blocks 2/3 the same of n-tile 1 (the register order of the plain path)."""
        K, R = src.shape[-2], src.shape[-1]
        if R % 8 or K % 16:
            self.fail(path, "an ldmatrix.trans tile is [16k, 8n] (B stored [K, N])")
        row, col, _, _ = self.tile_rc(src, path)
        fo = self.fragment_offsets(dst, path)
        KTd = db.shape[1] // 16
        w = self.w
        w.open("", path)
        w.line("const int cake_lr = ((cake_lane >> 3) & 1) * 8 + (cake_lane & 7), cake_lc = (cake_lane >> 4) * 8;")
        for kt in range(K // 16):
            for np_ in range(R // 16):
                addr = self.smem_addr(sb, st.src.slot, f"{row} + {kt * 16} + cake_lr", f"{col} + {np_ * 16} + cake_lc")
                e0 = ((fo[0] // 8 + 2 * np_) * KTd + fo[1] // 16 + kt) * 2
                e1 = ((fo[0] // 8 + 2 * np_ + 1) * KTd + fo[1] // 16 + kt) * 2
                w.line(f"cake::ldmatrix_x4_trans({addr}, {db.name}[{e0}], {db.name}[{e0 + 1}], {db.name}[{e1}], "
                       f"{db.name}[{e1 + 1}]);", path)
            if R % 16:
                nt = R // 8 - 1
                addr = self.smem_addr(sb, st.src.slot, f"{row} + {kt * 16} + ((cake_lane >> 3) & 1) * 8 + (cake_lane & 7)",
                                      f"{col} + {nt * 8}")
                e0 = ((fo[0] // 8 + nt) * KTd + fo[1] // 16 + kt) * 2
                w.line(f"cake::ldmatrix_x2_trans({addr}, {db.name}[{e0}], {db.name}[{e0 + 1}]);", path)
        w.close()

    def ldmatrix_trans_a(self, st, sb, db, src, dst, path):
        """A stored [K, M] (A^T row-major: K^T V_new takes K stored [tokens, channels] as its A^T):
        ldmatrix.trans hands lane l the pair (m = l / 4, k = 2 (l % 4) + {0, 1}) of each 8x8 block, the
        m16n8k16 A fragment. Blocks 0..3 are (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15),
        (m 8-15, k 8-15): a0..a3, the register order of the plain path."""
        K, M = src.shape[-2], src.shape[-1]
        if M % 16 or K % 16:
            self.fail(path, "an ldmatrix.trans tile for mma_a is [16k, 16m] (A stored [K, M])")
        row, col, _, _ = self.tile_rc(src, path)
        fo = self.fragment_offsets(dst, path)
        KTd = db.shape[1] // 16
        w = self.w
        w.open("", path)
        w.line("const int cake_lr = (cake_lane >> 4) * 8 + (cake_lane & 7), cake_lc = ((cake_lane >> 3) & 1) * 8;")
        for mt in range(M // 16):
            for kt in range(K // 16):
                addr = self.smem_addr(sb, st.src.slot, f"{row} + {kt * 16} + cake_lr", f"{col} + {mt * 16} + cake_lc")
                e = ((fo[0] // 16 + mt) * KTd + fo[1] // 16 + kt) * 4
                w.line(f"cake::ldmatrix_x4_trans({addr}, {db.name}[{e}], {db.name}[{e + 1}], {db.name}[{e + 2}], "
                       f"{db.name}[{e + 3}]);", path)
        w.close()

    # ---- matrix multiply
    def s_MmaSync(self, st: MmaSync, path):
        a, b, c = (resolve_tile(self.k, t) for t in (st.a, st.b, st.c))
        ab, bb, cb = a.buffer, b.buffer, c.buffer
        if None in (ab, bb, cb):
            self.fail(path, "mma_sync operands are register fragment buffers")
        if any(len(t.shape) != 2 for t in (a, b, c)) or any(len(x.shape) != 2 for x in (ab, bb, cb)):
            self.fail(path, "mma_sync operands are 2-d fragment tiles")
        TM, TK = a.shape
        TN = b.shape[0]
        cst = dict(self.k.consts)
        ao = [E.try_const(E.parse_index(o), cst) for o in (a.offset or (0, 0))]
        bo = [E.try_const(E.parse_index(o), cst) for o in (b.offset or (0, 0))]
        co = [E.try_const(E.parse_index(o), cst) for o in (c.offset or (0, 0))]
        if any(not isinstance(x, int) for x in ao + bo + co):
            self.fail(path, "fragment offsets must be constants")
        if len(ao) != 2 or len(bo) != 2 or len(co) != 2:
            self.fail(path, "fragment offsets have one entry per dim (2)")
        fn = "mma_16816_bf16" if ab.dtype == "bf16" else "mma_16816_f16"
        aKT, bKT, cNT = ab.shape[1] // 16, bb.shape[1] // 16, cb.shape[1] // 8
        w = self.w
        for mt in range(TM // 16):
            for nt in range(TN // 8):
                for kt in range(TK // 16):
                    ea = ((ao[0] // 16 + mt) * aKT + ao[1] // 16 + kt) * 4
                    eb = ((bo[0] // 8 + nt) * bKT + bo[1] // 16 + kt) * 2
                    ec = ((co[0] // 16 + mt) * cNT + co[1] // 8 + nt) * 4
                    w.line(f"cake::{fn}(&{cb.name}[{ec}], &{ab.name}[{ea}], &{bb.name}[{eb}]);", path)

    def s_Wgmma(self, st: Wgmma, path):
        M, N, K = st.shape
        a, b, acc = (resolve_tile(self.k, t) for t in (st.a, st.b, st.acc))
        ab, bb, cb = a.buffer, b.buffer, acc.buffer
        if None in (ab, bb, cb) or bb.space != "smem" or bb.layout not in DESC_SWIZZLE:
            self.fail(path, "wgmma reads b from a swizzled smem tile and accumulates into a wgmma_acc register tile")
        if M != 64 or K != 16 or N % 8 or not 8 <= N <= 256:  # N sizes the generated wrapper
            self.fail(path, f"wgmma shape is [64, N, 16] with N a multiple of 8 up to 256, got {list(st.shape)}")
        co = E.try_const(E.parse_index((acc.offset or (0, 0))[-1]), dict(self.k.consts))
        if not isinstance(co, int):
            self.fail(path, "accumulator column offset must be a constant")
        base = (co // 8) * 4
        ty = bb.dtype
        brow, bcol, _, _ = self.tile_rc(b, path)
        w = self.w
        if ab.space == "reg" or st.b_major == "mn":
            w.open("", path)
            self.wgmma_reg_a(st, a, b, base, brow, bcol, path)
            w.close()
            return
        if ab.space != "smem" or ab.layout not in DESC_SWIZZLE:
            self.fail(path, "wgmma reads a from a swizzled smem tile or an mma_a register fragment")
        TK = a.shape[-1]
        self.wgmma_ns.add((N, ty))
        arow, acol, _, _ = self.tile_rc(a, path)
        w.open("", path)
        # the k16 steps' descriptors: the first one's, 16 elements further each (one add, not a descriptor each)
        w.line(f"const cake::u64 cake_da = {self.desc(ab, st.a.slot, arow, acol)};", path)
        w.line(f"const cake::u64 cake_db = {self.desc(bb, st.b.slot, brow, bcol)};", path)
        for kk in range(TK // 16):
            ad, bd = (f"cake::wgmma_desc_add({d}, {kk * 16 * SIZE[x.dtype]}u)" if kk else d
                      for d, x in (("cake_da", ab), ("cake_db", bb)))
            scale = "1" if kk > 0 else f"({cond_c(st.accumulate)}) ? 1 : 0"
            w.line(f"cake_wgmma_m64n{N}k16_{ty}(&{cb.name}[{base}], {ad}, {bd}, {scale});", path)
        w.close()

    def wgmma_reg_a(self, st: Wgmma, a, b, base: int, brow: str, bcol: str, path):
        """wgmma with A from registers (an mma_a [16, 16] fragment per warp: warp w of the warpgroup holds
        rows 16 w .. 16 w + 15, the mma.sync A layout), B K-major or MN-major (`b_major` "mn": an smem tile
        [TK, N] of K rows, N contiguous, one swizzle atom wide or `b_atom_rows` apart; a k16 step is 16 rows
        further, two 8-row swizzle blocks at SBO 1024 bytes; the instruction's trans-b bit set)."""
        N = st.shape[1]
        ab, bb, cb = a.buffer, b.buffer, resolve_tile(self.k, st.acc).buffer
        ty = bb.dtype
        tb = 1 if st.b_major == "mn" else 0
        TK = b.shape[0] if tb else b.shape[-1]
        if ab.space != "reg":
            self.fail(path, "wgmma with an MN-major b takes A from registers")
        ao = [E.try_const(E.parse_index(o), dict(self.k.consts)) for o in (a.offset or (0, 0))]
        if ab.layout != "mma_a" or list(a.shape) != [16, 16] or len(ao) != 2 \
                or any(not isinstance(o, int) or o % 16 for o in ao):
            self.fail(path, "a wgmma A operand in registers is a [16, 16] block of an mma_a fragment per warp "
                            "(constant offsets, multiples of 16)")
        # block (mt, kt) of the fragment: its registers (mt * KT + kt) * 4 .. + 3 (the onehot / ldmatrix order)
        areg = (ao[0] // 16 * (ab.shape[1] // 16) + ao[1] // 16) * 4
        if TK != 16:
            self.fail(path, f"with A in registers (one k16 step) b spans 16 K, not {TK}")
        if tb and b.shape[-1] != N and not (st.b_atom_rows and N % b.shape[-1] == 0):
            self.fail(path, f"an MN-major b [TK, {b.shape[-1]}] covers N = {N} only with b_atom_rows")
        self.wgmma_rs_ns.add((N, ty, tb))
        # K-major [N, 16] or MN-major [16, N]: the same SBO (8 rows); MN-major N beyond one atom: LBO = the
        # atoms' distance
        lbo = st.b_atom_rows * row_pitch_elems(bb) * SIZE[ty] if st.b_atom_rows else 16
        bd = self.desc(bb, st.b.slot, brow, bcol, lbo=lbo)
        scale = f"({cond_c(st.accumulate)}) ? 1 : 0"
        self.w.line(f"cake_wgmma_rs_m64n{N}k16_{ty}_t{tb}(&{cb.name}[{base}], &{ab.name}[{areg}], {bd}, {scale});", path)

    def emit_wgmma_rs_wrapper(self, n: int, ty: str, tb: int):
        w = self.w
        nreg = n // 2
        regs = ", ".join(f"%{i}" for i in range(nreg))
        outs = ", ".join(f'"+f"(d[{i}])' for i in range(nreg))
        a = ", ".join(f"%{nreg + i}" for i in range(4))
        w.line(f"__device__ __forceinline__ void cake_wgmma_rs_m64n{n}k16_{ty}_t{tb}(float* d, const unsigned* a, "
               "cake::u64 db, int scale_d) {")
        w.line("#if __CUDA_ARCH__ >= 900")
        w.line('  asm volatile("{\\n .reg .pred p;\\n setp.ne.b32 p, %' + str(nreg + 5) + ', 0;\\n"')
        w.line(f'    " wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{regs}}}, {{{a}}}, %{nreg + 4}, p, 1, 1, {tb};\\n}}\\n"')
        w.line(f'    : {outs}')
        w.line('    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));')
        w.line("#endif")
        w.line("}")

    def desc(self, b: Buffer, slot, row_c: str, col_c: str, lbo: int = 16) -> str:
        es = SIZE[b.dtype]
        pitch = row_pitch_elems(b) * es
        stage = ""
        if b.stages > 1 or slot not in (None, 0, "0"):
            stage = f" + (unsigned)({ix(slot if slot is not None else 0)}) * {self.plan.stage_strides[b.name]}u"
        # the stage's descriptor (one expression for every tile of the stage: the compiler computes it once),
        # stepped to the tile's first row and column
        base = f"cake_smem_base + {self.plan.offsets[b.name]}u{stage}"
        sbo = 8 * pitch
        return (f"cake::wgmma_desc_add(cake::wgmma_desc({base}, {lbo}, {sbo}, {DESC_SWIZZLE[b.layout]}), "
                f"(unsigned)(({row_c}) * {pitch} + ({col_c}) * {es}))")

    def emit_wgmma_wrapper(self, n: int, ty: str):
        w = self.w
        nreg = n // 2
        regs = ", ".join(f"%{i}" for i in range(nreg))
        outs = ", ".join(f'"+f"(d[{i}])' for i in range(nreg))
        w.line(f"__device__ __forceinline__ void cake_wgmma_m64n{n}k16_{ty}(float* d, cake::u64 da, cake::u64 db, int scale_d) {{")
        w.line("#if __CUDA_ARCH__ >= 900")
        w.line('  asm volatile("{\\n .reg .pred p;\\n setp.ne.b32 p, %' + str(nreg + 2) + ', 0;\\n"')
        w.line(f'    " wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{regs}}}, %{nreg}, %{nreg + 1}, p, 1, 1, 0, 0;\\n}}\\n"')
        w.line(f'    : {outs}')
        w.line('    : "l"(da), "l"(db), "r"(scale_d));')
        w.line("#endif")
        w.line("}")

    # ---- element-wise and reductions over register tiles
    def reg_tile(self, ref: TileRef, path) -> Buffer:
        b = self.buf(ref.buf, path)
        if b.space != "reg":
            self.fail(path, f"{ref.buf!r} is not a register tile")
        if ref.offset and any(str(o) != "0" for o in ref.offset):
            self.fail(path, "element-wise ops take whole register tiles")
        return b

    def s_Fill(self, st: Fill, path):
        b = self.reg_tile(st.dst, path)
        n = self.reg_count(b)
        val = self.to_storage(b.dtype, repr(float(st.value)) + "f")
        self.w.line("#pragma unroll")
        self.w.line(f"for (int cake_e = 0; cake_e < {n}; ++cake_e) {b.name}[cake_e] = {val};", path)

    def elem_index(self, dst: Buffer, src: Buffer, path) -> str:
        """C index into `src` for element cake_e of `dst`: the same tile (leading 1-dims aside), a
        scalar [1,1], a row broadcast [R,1] (per-thread rows) or a column broadcast [1,C] (a blocked
        vector of the same scope and vec: every thread holds the columns of its own chunks)."""
        def squeeze(shape):
            shape = list(shape)
            while len(shape) > 1 and shape[0] == 1:
                shape = shape[1:]
            return shape
        same_kind = src.layout == dst.layout and src.vec == dst.vec and src.scope == dst.scope
        if src.layout == dst.layout and src.vec == dst.vec and (
                list(src.shape) == list(dst.shape) or (src.scope == dst.scope and squeeze(src.shape) == squeeze(dst.shape))):
            return "cake_e"
        if prod(src.shape) == 1:
            return "0"
        if dst.layout == "mma_acc" and src.layout == "mma_rows" and list(src.shape) == [dst.shape[0], 1]:
            # a per-row value beside the accumulator: element e sits in m-tile (e / 4) / NT, row half (e % 4) / 2
            return f"((((cake_e >> 2) / {dst.shape[1] // 8}) << 1) + ((cake_e & 3) >> 1))"
        if src.scope == dst.scope == "thread" and [d for d in src.shape if d != 1] == [d for d in dst.shape if d != 1]:
            return "cake_e"   # per-thread tiles are row-major: size-1 dims do not move elements
        C = dst.shape[-1]
        if dst.layout == "blocked" and dst.vec == C and len(dst.shape) > 1:
            # every chunk of dst is one whole row (thread-owned rows, e.g. [K, VW] with vec VW)
            T = self.scope_threads(dst.scope)
            R = dst.shape[-2]
            if src.scope == "thread" and [d for d in src.shape if d != 1] == [C]:
                return f"(cake_e % {C})"                       # a per-thread [1, C] row: column c
            if (src.layout == "blocked" and src.vec == 1 and src.scope == dst.scope and squeeze(src.shape) == [R]
                    and prod(dst.shape[:-2]) == 1 and R % T == 0):
                return f"(cake_e / {C})"                       # a blocked [R] vector: the chunk's row
        if dst.layout == "blocked" and same_kind and squeeze(src.shape) == [C] and len(dst.shape) > 1:
            T, V = self.scope_threads(dst.scope), dst.vec
            if C % (T * V):
                self.fail(path, f"column broadcast needs rows ({C}) to be a multiple of threads x vec ({T * V})")
            return f"((((cake_e / {V}) % {C // (T * V)}) * {V}) + (cake_e % {V}))"
        if dst.layout == "blocked" and src.shape[-1] == 1 and list(src.shape[:-1]) == list(dst.shape[:-1]):
            T = self.scope_threads(dst.scope)
            V, C = dst.vec, dst.shape[-1]
            if C % (T * V):
                self.fail(path, f"row broadcast needs rows ({C}) to be a multiple of threads x vec ({T * V})")
            return f"(((cake_e / {V}) * {T * V}) / {C})"
        self.fail(path, f"cannot broadcast {src.name}{list(src.shape)} to {dst.name}{list(dst.shape)}")

    def s_Map(self, st: Map, path):
        db = self.reg_tile(st.dst, path)
        node = E.parse_value(st.expr)
        scalars = {p.name: p for p in self.k.params if isinstance(p, ScalarParam)}
        if db.layout == "mma_a":
            return self.map_to_operand(db, node, scalars, path)

        def tile_elem(b: Buffer) -> str:
            if b.space != "reg":
                self.fail(path, f"map reads register tiles; {b.name!r} is {b.space}")
            return f"{b.name}[{self.elem_index(db, b, path)}]"
        rhs = E.to_c(node, self.map_var(scalars, tile_elem), float_mode=True)
        n = self.reg_count(db)
        coords = {c.fn for c in E.walk(node) if isinstance(c, E.Call) and c.fn in ("row", "col")}
        if coords:
            return self.map_with_coords(db, rhs, n, path)
        self.w.line("#pragma unroll")
        self.w.line(f"for (int cake_e = 0; cake_e < {n}; ++cake_e) {db.name}[cake_e] = {self.to_storage(db.dtype, rhs)};", path)

    def map_var(self, scalars, tile_elem):
        """How a map expression's names render in C: register tiles through `tile_elem` (converted from
        their storage type), scalar params, consts and index names as floats."""
        def var(v: E.Var) -> str:
            b = self.k.buffer(v.name)
            if b is not None:
                e = tile_elem(b)
                return self.from_storage(b.dtype, e)
            if v.name in scalars:
                return f"(float){v.name}"
            if v.name in self.k.consts:
                return f"{float(self.k.consts[v.name])!r}f"
            return f"(float)({BUILTIN_C.get(v.name, v.name)})"
        return var

    def map_with_coords(self, db: Buffer, rhs: str, n: int, path):
        """A map whose expression uses row() / col(): the element's coordinates in the destination tile --
        col() its index in the last dim, row() its index over all the others (flattened), so a [16, 1, 1]
        column of tokens has row() = token -- from the layout's element -> (row, column) map."""
        w = self.w
        C = db.shape[-1]
        w.open("", path)
        w.line("#pragma unroll")
        w.open(f"for (int cake_e = 0; cake_e < {n}; ++cake_e)")
        if db.layout == "mma_acc":
            self.acc_coords(C)
        elif db.layout == "blocked":
            T, V = self.scope_threads(db.scope), db.vec
            t = self.scope_index(db.scope)
            if C % (T * V) == 0:
                # a row spans whole chunks of the scope: row() is a function of cake_e alone, constant in
                # the unrolled loop, so row masks and per-row selects fold at compile time
                per = C // (T * V)
                w.line(f"const int cake_row = (cake_e / {V}) / {per}, "
                       f"cake_col = (((cake_e / {V}) % {per}) * {T} + {t}) * {V} + cake_e % {V};")
            else:
                w.line(f"const int cake_f = ((cake_e / {V}) * {T} + {t}) * {V} + cake_e % {V};")
                w.line(f"const int cake_row = cake_f / {C}, cake_col = cake_f % {C};")
        elif db.layout == "row_major" and db.scope == "thread":
            w.line(f"const int cake_row = cake_e / {C}, cake_col = cake_e % {C};")
        else:
            self.fail(path, f"row() / col() are defined on mma_acc, blocked and per-thread tiles, not {db.layout}")
        w.line("(void)cake_row; (void)cake_col;")        # an expression may use only one of them
        w.line(f"{db.name}[cake_e] = {self.to_storage(db.dtype, rhs)};", path)
        w.close()
        w.close()

    def map_to_operand(self, db: Buffer, node, scalars, path):
        """map into an mma_a fragment from mma_acc tiles of the same [M, K] shape: the accumulator of one
        mma becomes the A operand of the next (P V after Q K^T, A_qk V_new in chunked linear attention)
        without shared memory. A lane's accumulator pairs (row g / g + 8, columns 2t, 2t + 1 of each n8
        tile) are exactly its A pairs (same rows, k = 2t, 2t + 1 of each k8 half): A register r of k-tile
        kt packs n-tile 2 kt + r / 2, row half r % 2. The expression is applied per element first."""
        for v in E.walk(node):
            if isinstance(v, E.Var):
                b = self.k.buffer(v.name)
                if b is not None and (b.space != "reg" or b.layout != "mma_acc" or list(b.shape) != list(db.shape)):
                    self.fail(path, f"a map into the mma_a fragment {db.name!r} reads mma_acc tiles of its shape "
                              f"{list(db.shape)}; {v.name!r} is a {b.layout} {list(b.shape)} tile")
        if len(db.shape) != 2 or db.shape[0] % 16 or db.shape[1] % 16:
            self.fail(path, "mma_a fragments are [16 i, 16 j]")
        if any(isinstance(c, E.Call) and c.fn in ("row", "col") for c in E.walk(node)):
            self.fail(path, "row() / col() are not defined while packing an mma_a fragment: mask the accumulator first")
        pack = {"bf16": "cake::pack_bf16x2", "f16": "cake::pack_f16x2"}.get(db.dtype)
        if pack is None:
            self.fail(path, f"mma_a fragments hold bf16 or f16, not {db.dtype}")

        rhs = E.to_c(node, self.map_var(scalars, lambda b: f"{b.name}[cake_e]"), float_mode=True)
        MT, KT = db.shape[0] // 16, db.shape[1] // 16
        w = self.w
        w.open("", path)
        w.line("#pragma unroll")
        w.open(f"for (int cake_q = 0; cake_q < {MT * KT * 4}; ++cake_q)")
        w.line(f"const int cake_m = cake_q / {KT * 4}, cake_kt = (cake_q / 4) % {KT}, cake_r = cake_q % 4;")
        w.line(f"const int cake_c = ((cake_m * {2 * KT} + 2 * cake_kt + (cake_r >> 1)) * 4) + (cake_r & 1) * 2;")
        w.line("float cake_lo, cake_hi;")
        w.line(f"{{ const int cake_e = cake_c; cake_lo = {rhs}; }}")
        w.line(f"{{ const int cake_e = cake_c + 1; cake_hi = {rhs}; }}")
        w.line(f"{db.name}[cake_q] = {pack}(cake_lo, cake_hi);", path)
        w.close()
        w.close()

    def s_Reduce(self, st: Reduce, path):
        b0 = self.buf(st.src.buf, path)
        if b0.space == "smem":
            return self.reduce_smem(st, path)
        if st.accumulate:
            self.fail(path, "accumulate is for shared-memory reductions (an smem src tile)")
        sb, db = self.reg_tile(st.src, path), self.reg_tile(st.dst, path)
        if sb.layout != "blocked" and not (sb.layout == "row_major" and sb.scope == "thread"):
            self.fail(path, f"reduce over a {sb.layout} tile is not lowered yet (blocked or per-thread tiles)")
        if st.axis == len(sb.shape) - 2 and sb.layout == "blocked" and sb.vec == sb.shape[-1] and st.kind in ("sum", "sum_sq"):
            # a column reduction: sum over the rows of a tile whose chunks are whole rows (vec == C)
            C = sb.shape[-1]
            if self.scope_threads(sb.scope) > 32:
                self.fail(path, "a column reduction runs over a warp-scope tile")
            if prod(sb.shape[:-2]) != 1:
                self.fail(path, "a column reduction reads one [R, C] matrix")
            if self.reg_count(db) != C and prod(db.shape) != C:
                self.fail(path, f"a column reduction writes {C} values per thread (dst holds {prod(db.shape)})")
            return self.emit_sums([self.sum_plan(st, path)], path)
        if st.axis != len(sb.shape) - 1:
            self.fail(path, "reduce runs along the last axis (or along rows of a blocked tile whose chunks are whole rows)")
        w = self.w
        op = {"sum": ("+", "0.0f", "sum"), "sum_sq": ("+", "0.0f", "sum"), "max": ("fmaxf", "(-cake::inf())", "max"),
              "min": ("fminf", "cake::inf()", "min")}[st.kind]
        T = self.scope_threads(sb.scope) if sb.layout == "blocked" else 1
        V, C = (sb.vec, sb.shape[-1]) if sb.layout == "blocked" else (sb.shape[-1], sb.shape[-1])
        R = prod(sb.shape[:-1])
        if sb.layout == "blocked" and C % (T * V):
            self.fail(path, f"row reduction needs rows ({C}) to be a multiple of threads x vec ({T * V})")
        n = self.reg_count(sb)
        row = f"(((cake_e / {V}) * {T * V}) / {C})" if sb.layout == "blocked" else f"(cake_e / {C})"
        acc = self.fresh("red")

        def comb(a, b):
            return f"({a} + {b})" if op[0] == "+" else f"{op[0]}({a}, {b})"

        w.open("", path)
        w.line(f"float {acc}[{R}];")
        w.line("#pragma unroll")
        w.line(f"for (int cake_i = 0; cake_i < {R}; ++cake_i) {acc}[cake_i] = {op[1]};")
        w.line("#pragma unroll")
        val = self.reduce_value(st, sb)
        w.line(f"for (int cake_e = 0; cake_e < {n}; ++cake_e) {acc}[{row}] = {comb(f'{acc}[{row}]', val)};")
        if T > 1:
            self.warp_reduce(acc, R, op[2])
        if T > 32:
            key = self.role.name if self.role is not None else "_prologue"
            if key not in self.plan.scratch_offsets:
                self.fail(path, "no reduction scratch planned")
            nw = T // 32
            if nw * R > 64:
                self.fail(path, "scope-wide reduction of more than 64 warp-rows")
            sync = self.scope_barrier(sb.scope, path)
            wi = {"cta": "cake_warp", "role": "cake_role_warp", "warpgroup": "(cake_role_warp & 3)"}[sb.scope]
            scr = f"reinterpret_cast<float*>(cake_smem + {self.plan.scratch_offsets[key]})"
            w.line(f"float* cake_scr = {scr};")
            w.line(sync)
            w.line("#pragma unroll")
            w.line(f"for (int cake_i = 0; cake_i < {R}; ++cake_i) if (cake_lane == 0) cake_scr[{wi} * {R} + cake_i] = {acc}[cake_i];")
            w.line(sync)
            w.line("#pragma unroll")
            w.open(f"for (int cake_i = 0; cake_i < {R}; ++cake_i)")
            w.line(f"float cake_t = cake_scr[cake_i];")
            w.line("#pragma unroll")
            w.line(f"for (int cake_j = 1; cake_j < {nw}; ++cake_j) cake_t = {comb('cake_t', f'cake_scr[cake_j * {R} + cake_i]')};")
            w.line(f"{acc}[cake_i] = cake_t;")
            w.close()
        dn = self.reg_count(db)
        if dn != R and prod(db.shape) != R:
            self.fail(path, f"reduce destination holds {prod(db.shape)} values, expected {R}")
        w.line("#pragma unroll")
        w.line(f"for (int cake_i = 0; cake_i < {R}; ++cake_i) {db.name}[cake_i] = {self.to_storage(db.dtype, f'{acc}[cake_i]')};")
        w.close()

    def reduce_value(self, st: Reduce, sb: Buffer) -> str:
        """Element cake_e of a reduce's source as it enters the sum (float; squared for sum_sq)."""
        val = self.from_storage(sb.dtype, f"{sb.name}[cake_e]")
        return f"cake::sq({val})" if st.kind == "sum_sq" else val

    def sum_plan(self, st, path) -> Optional[SumPlan]:
        """A sum / sum_sq over a blocked register tile of a warp (or one thread) as a SumPlan: along the
        last axis when every row spans the scope, or along the rows (a column reduction) when chunks
        are whole rows; None for any other reduce (s_Reduce's general path lowers it)."""
        if not isinstance(st, Reduce) or st.kind not in ("sum", "sum_sq") or st.src.buf == st.dst.buf:
            return None
        sb, db = self.k.buffer(st.src.buf), self.k.buffer(st.dst.buf)
        if sb is None or db is None or sb.space != "reg" or db.space != "reg" or sb.layout != "blocked" \
                or sb.scope not in ("warp", "thread"):
            return None
        T = self.scope_threads(sb.scope)
        C, V = sb.shape[-1], sb.vec
        if st.axis == len(sb.shape) - 2 and V == C and prod(sb.shape[:-2]) == 1:
            R, idx = C, f"cake_e % {C}"
        elif st.axis == len(sb.shape) - 1 and C % (T * V) == 0:
            R, idx = prod(sb.shape[:-1]), f"(((cake_e / {V}) * {T * V}) / {C})"
        else:
            return None
        if self.reg_count(db) != R and prod(db.shape) != R:
            return None
        return SumPlan(self.reg_count(sb), idx, self.reduce_value(st, sb), R, db, T)

    def fusable_sums(self, a, b, path):
        """Both statements warp sums whose rows together fit one cake::warp_sum_rows, the second not
        reading or writing what the first writes (so computing them together changes nothing)."""
        if not isinstance(a, Reduce) or not isinstance(b, Reduce) or a.note or b.note:
            return None
        if a.dst.buf in (b.src.buf, b.dst.buf) or b.dst.buf == a.src.buf:
            return None
        pa, pb = self.sum_plan(a, path), self.sum_plan(b, path)
        if not pa or not pb or pa.threads != 32 or pb.threads != 32:
            return None
        R = pa.rows + pb.rows
        if R > 32 or R & (R - 1):
            return None
        return pa, pb

    def emit_sums(self, plans, path):
        """One or two SumPlans in one accumulator array: per-lane partial sums, one shuffle tree over
        all their rows (cake::warp_sum_rows where the row count allows), then each destination."""
        w = self.w
        acc = self.fresh("red")
        R = sum(p.rows for p in plans)
        w.open("", path)
        w.line(f"float {acc}[{R}];")
        w.line("#pragma unroll")
        w.line(f"for (int cake_i = 0; cake_i < {R}; ++cake_i) {acc}[cake_i] = 0.0f;")
        base = 0
        for p in plans:
            w.line("#pragma unroll")
            w.line(f"for (int cake_e = 0; cake_e < {p.n}; ++cake_e) {acc}[{f'{base} + ' if base else ''}{p.idx}] += {p.val};")
            base += p.rows
        if plans[0].threads > 1:
            self.warp_reduce(acc, R, "sum")
        base = 0
        for p in plans:
            w.line("#pragma unroll")
            w.line(f"for (int cake_i = 0; cake_i < {p.rows}; ++cake_i) {p.dst.name}[cake_i] = "
                   f"{self.to_storage(p.dst.dtype, f'{acc}[{base} + cake_i]' if base else f'{acc}[cake_i]')};")
            base += p.rows
        w.close()

    def warp_reduce(self, acc: str, R: int, kind: str):
        """Reduce each of the R per-lane values `acc[i]` over the warp, all totals in every lane: sums of
        several rows share their shuffles (cake::warp_sum_rows), anything else is one butterfly per row."""
        if kind == "sum" and 2 <= R <= 32 and R & (R - 1) == 0:
            self.w.line(f"cake::warp_sum_rows<{R}>({acc});")
            return
        self.w.line("#pragma unroll")
        self.w.line(f"for (int cake_i = 0; cake_i < {R}; ++cake_i) {acc}[cake_i] = cake::warp_{kind}({acc}[cake_i]);")

    # ---- selection, atomics, grid completion
    def vec_addr(self, ref: TileRef, i_c: str, path) -> str:
        """Byte address (shared window) of element `i_c` of an smem f32 vector tile ([n] or [1, n])."""
        t = resolve_tile(self.k, ref)
        b = t.buffer
        if b is None or b.space != "smem" or b.dtype != "f32" or prod(b.shape) != b.shape[-1]:
            self.fail(path, f"{ref.buf!r} must be an smem f32 vector ([n] or [1, n])")
        off = ix(t.offset[-1]) if t.offset else "0"
        stage = ""
        if b.stages > 1 or ref.slot not in (None, 0, "0"):
            stage = f" + (unsigned)({ix(ref.slot if ref.slot is not None else 0)}) * {self.plan.stage_strides[b.name]}u"
        return f"(cake_smem_base + {self.plan.offsets[b.name]}u{stage} + 4u * (unsigned)(({off}) + ({i_c})))"

    @staticmethod
    def smem_f32(addr: str) -> str:
        """A plain (CSE-able, barrier-ordered) load of the f32 at a shared-window address."""
        return f"(*reinterpret_cast<const float*>(cake_smem + ({addr} - cake_smem_base)))"

    def rows_slots(self, TM: int, wg: bool = False):
        """(slot, row C expression) of the rows a lane holds in an [TM, *] mma_acc / mma_rows tile (wg: in
        its warp's 16 rows of a [64, *] wgmma_acc tile, whose row numbers start at 16 x the warp's index
        in the warpgroup)."""
        base = "16 * (cake_wg_tid >> 5) + " if wg else ""
        return [(2 * m + h, f"{base}{16 * m + 8 * h} + (cake_lane >> 2)") for m in range(TM // 16) for h in range(2)]

    @_robust
    def s_TopK(self, st: TopK, path):
        sb, vb, ib = (self.reg_tile(r, path) for r in (st.src, st.vals, st.idx))
        K = st.k
        mn = "true" if st.kind == "min" else "false"
        lim = f"(int)({ix(st.limit)})" if st.limit is not None else None
        w = self.w
        w.open("", path)
        fn = f"cake::topk_insert<{K}, {mn}>"
        if sb.layout in ("mma_acc", "wgmma_acc"):
            # a [64, N] wgmma_acc tile: each warp holds 16 of its rows in the mma_acc [16, N] register
            # layout, so a warp keeps the lists of its own 16 rows (mma_rows [16, k])
            wg = sb.layout == "wgmma_acc"
            TM, TN = sb.shape
            if wg and TM != 64:
                self.fail(path, f"topk over a wgmma_acc tile takes one warpgroup tile [64, N], not [{TM}, {TN}]")
            TM = 16 if wg else TM
            if K > 1 and st.chains != 1:
                self.fail(path, "chains is for k = 1 (a running argmin / argmax): k > 1 filters and inserts per score")
            if vb.layout != "mma_rows" or ib.layout != "mma_rows" or list(vb.shape) != [TM, K] or list(ib.shape) != [TM, K]:
                self.fail(path, f"topk over an {sb.layout} [{sb.shape[0]}, {TN}] tile keeps mma_rows lists of shape [{TM}, {K}]")
            if st.src_idx is not None:
                self.fail(path, "src_idx is for per-thread (row_major) score tiles")
            NT = TN // 8
            w.line("const int cake_c0 = 2 * (cake_lane & 3);")
            w.line(f"const int cake_cb = (int)({ix(st.col)});")
            if K > 1 and st.rolled and 2 * NT > 64:
                self.fail(path, f"rolled keeps a lane's passing columns of a row in a 64-bit mask: N <= 256 (got {TN})")
            if K > 1:
                queue = self.topk_queue(st, TM, path)
                bound = self.topk_bound(st, sb.shape[0], path)
                self.topk_acc_filtered(st, sb, vb, ib, TM, NT, K, mn, lim, path, wg, queue, bound)
                w.close()
                return
            if st.queue_vals is not None or st.queue_idx is not None:
                self.fail(path, "a top-1 selection keeps no queue (its running best is one compare per score)")
            if st.shared_bound is not None:
                self.fail(path, "a top-1 selection shares no bound (its running best is one compare per score)")
            if st.valid_rows is not None:
                self.fail(path, "valid_rows is for k > 1 (a top-1's running best is one compare per score)")
            if st.given_bound is not None:
                self.fail(path, "a given bound is for k > 1 (a top-1's running best is one compare per score)")
            if st.rolled:
                self.fail(path, "rolled is for k > 1 (a top-1's running best has no insertion to roll)")
            if NT % st.chains:
                self.fail(path, f"chains ({st.chains}) must divide the tile's column pairs per lane, N / 8 = {NT} "
                                f"(legal: {[c for c in range(1, 9) if NT % c == 0]})")
            self.topk1_acc(st, sb, vb, ib, TM, NT, mn, lim, path, wg)
        elif sb.layout == "row_major" and sb.scope == "thread":
            R, C = prod(sb.shape[:-1]), sb.shape[-1]
            if vb.layout != "row_major" or ib.layout != "row_major" or prod(vb.shape) != R * K or prod(ib.shape) != R * K:
                self.fail(path, f"topk over a per-thread [{R}, {C}] tile keeps per-thread [{R}, {K}] lists")
            if st.queue_vals is not None or st.queue_idx is not None:
                self.fail(path, "deferred insertion (a queue) is for mma_acc / wgmma_acc score tiles")
            if st.shared_bound is not None:
                self.fail(path, "a shared bound is for mma_acc / wgmma_acc score tiles")
            if st.valid_rows is not None or st.given_bound is not None:
                self.fail(path, "valid_rows and a given bound are for mma_acc / wgmma_acc score tiles")
            if st.chains != 1 or st.rolled:
                self.fail(path, "chains (k = 1) and rolled (k > 1) are for mma_acc / wgmma_acc score tiles")
            xb = self.reg_tile(st.src_idx, path) if st.src_idx is not None else None
            if st.src_sorted:   # each src row is a sorted list of k (E-TOPK-05): a bitonic merge per row
                problems = sorted_merge_problems(self.k, st)
                if problems:
                    self.fail(path, problems[0][1])
                for r in range(R):
                    w.line(f"cake::topk_merge_sorted<{K}, {mn}>(&{vb.name}[{r * K}], &{ib.name}[{r * K}], "
                           f"&{sb.name}[{r * C}], &{xb.name}[{r * C}]);")
                w.close()
                return
            w.line(f"const int cake_cb = (int)({ix(st.col)});")
            w.line("#pragma unroll")
            w.open(f"for (int cake_r = 0; cake_r < {R}; ++cake_r)")
            w.line("#pragma unroll")
            w.open(f"for (int cake_c = 0; cake_c < {C}; ++cake_c)")
            gi = f"{xb.name}[cake_r * {C} + cake_c]" if xb is not None else "cake_cb + cake_c"
            w.line(f"const int cake_gi = {gi};")
            rbias = f" + {self.smem_f32(self.vec_addr(st.row_bias, 'cake_r', path))}" if st.row_bias is not None else ""
            cbias = f" + {self.smem_f32(self.vec_addr(st.col_bias, 'cake_c', path))}" if st.col_bias is not None else ""
            v = self.from_storage(sb.dtype, f"{sb.name}[cake_r * {C} + cake_c]")
            w.line(f"const float cake_v = {float(st.scale)!r}f * {v}{rbias}{cbias};")
            call = f"{fn}(&{vb.name}[cake_r * {K}], &{ib.name}[cake_r * {K}], cake_v, cake_gi);"
            w.line(f"if (cake_gi < {lim}) {call}" if lim else call)
            w.close()
            w.close()
        else:
            self.fail(path, f"topk reads an mma_acc, wgmma_acc or per-thread row_major score tile, not {sb.layout}")
        w.close()

    def topk1_acc(self, st: TopK, sb, vb, ib, TM: int, NT: int, mn: str, lim, path, wg: bool = False):
        """topk k = 1 (a running argmin / argmax) over an mma_acc / wgmma_acc tile: per row the lane scans
        its 2 * NT columns in increasing index order with a strict compare (the first, smallest index
        wins a tie among them), u = scale * acc + col_bias (one FMA), then enters its best, plus the row
        bias, with the exact (value, index) test. Per score an FMA, a compare and two selects; the
        limit is tested on the partial tile only (a separate scan). The same result as testing every
        score exactly: within a lane the columns ascend, across lanes and calls the exact test breaks
        ties by index. chains > 1: the lane's column pairs n go to running best n % chains (each still
        ascending), joined by the exact test: the dependent compare-select chain per row is chains times
        shorter (2 rows per lane keep only 2 chains in flight; measured 0-7% slower on the k-means picks:
        the join and the registers cost more than the chain there)."""
        w = self.w
        better = "<" if mn == "true" else ">"
        worst = "cake::inf()" if mn == "true" else "(-cake::inf())"
        slots = self.rows_slots(TM, wg)
        # the bias through a pointer at the lane's first column: its loads take constant offsets (LDS [R + imm])
        # where the full address per column cost an IMAD, a LEA and a LOP each
        cb_v = "cake_cbp[cake_n * 8 + cake_j]" if st.col_bias is not None else None
        C = st.chains
        best = (lambda slot: f"{slot}") if C == 1 else (lambda slot: f"{slot} * {C} + cake_n % {C}")

        def scan(guard: bool):
            w.line("#pragma unroll")
            w.open(f"for (int cake_n = 0; cake_n < {NT}; ++cake_n)")
            w.line("#pragma unroll")
            w.open("for (int cake_j = 0; cake_j < 2; ++cake_j)")
            w.line("const int cake_c = cake_n * 8 + cake_c0 + cake_j;")
            if cb_v is not None:
                w.line(f"const float cake_cbv = {cb_v};")
            for slot, _ in slots:
                m, h = slot // 2, slot % 2
                src = f"{sb.name}[(({m}) * {NT} + cake_n) * 4 + {2 * h} + cake_j]"
                u = (f"__fmaf_rn({float(st.scale)!r}f, {src}, cake_cbv)" if cb_v is not None
                     else f"{float(st.scale)!r}f * {src}")
                b = best(slot)
                cond = f"cake_u {better} cake_bu[{b}]"
                if guard:
                    cond = f"cake_c < cake_rem && {cond}"
                w.open("")
                w.line(f"const float cake_u = {u};")
                w.line(f"if ({cond}) {{ cake_bu[{b}] = cake_u; cake_bc[{b}] = cake_c; }}")
                w.close()
            w.close()
            w.close()
        S = len(slots)
        if cb_v is not None:
            w.line("const float* cake_cbp = reinterpret_cast<const float*>(cake_smem + "
                   f"({self.vec_addr(st.col_bias, 'cake_c0', path)} - cake_smem_base));")
        w.line(f"float cake_bu[{S * C}]; int cake_bc[{S * C}];")
        w.line("#pragma unroll")
        w.line(f"for (int cake_h = 0; cake_h < {S * C}; ++cake_h) {{ cake_bu[cake_h] = {worst}; cake_bc[cake_h] = 0; }}")
        if lim:
            w.line(f"const int cake_rem = {lim} - cake_cb;   // columns c < cake_rem are in range")
            w.open(f"if (cake_rem >= {8 * NT})")
            scan(False)
            w.close()
            w.open("else")
            scan(True)
            w.close()
        else:
            scan(False)
        if C > 1:   # each slot's chains into its first, by the exact (value, smaller index) test
            for slot, _ in slots:
                for c in range(1, C):
                    a, o = slot * C, slot * C + c
                    w.line(f"if (cake_bu[{o}] {better} cake_bu[{a}] || (cake_bu[{o}] == cake_bu[{a}] && "
                           f"cake_bc[{o}] < cake_bc[{a}])) {{ cake_bu[{a}] = cake_bu[{o}]; cake_bc[{a}] = cake_bc[{o}]; }}")
        for slot, row in slots:
            slot_c = slot * C
            rb = f" + {self.smem_f32(self.vec_addr(st.row_bias, row, path))}" if st.row_bias is not None else ""
            # a row with no column in range keeps its list: its best is the worst value (never better)
            w.line(f"cake::topk_insert<1, {mn}>(&{vb.name}[{slot}], &{ib.name}[{slot}], cake_bu[{slot_c}]{rb}, "
                   f"cake_cb + cake_bc[{slot_c}]);")

    def topk_queue(self, st, TM: int, path):
        """(values, indices, T) of st's deferred-insertion queue (mma_rows [TM, T]), or None."""
        if st.queue_vals is None and st.queue_idx is None:
            return None
        if st.queue_vals is None or st.queue_idx is None:
            self.fail(path, "a queue takes both queue_vals and queue_idx")
        qv, qi = self.reg_tile(st.queue_vals, path), self.reg_tile(st.queue_idx, path)
        if qv.layout != "mma_rows" or qi.layout != "mma_rows" or list(qv.shape) != list(qi.shape) or qv.shape[0] != TM:
            self.fail(path, f"a topk queue is a pair of mma_rows tiles [{TM}, T]")
        return qv, qi, qv.shape[1]

    def topk_bound(self, st, rows: int, path):
        """(a function from a row's C expression (within the score tile's `rows` rows) to the C pointer of
        its shared-bound word (st.shared_bound: a global i32 tile [rows, 1]), the bound cache's register
        tile or None), or None without a shared bound."""
        if st.shared_bound is None:
            return None
        word = self.bound_words(st.shared_bound, rows, path)
        if st.bound_cache is None:
            return word, None
        cb = self.reg_tile(st.bound_cache, path)
        lists = self.reg_tile(st.vals, path)
        if cb.layout != "mma_rows" or cb.dtype != "f32" or list(cb.shape) != [lists.shape[0], 1]:
            self.fail(path, f"a bound cache is an mma_rows f32 tile [{lists.shape[0]}, 1] (a register per list row)")
        return word, cb

    def bound_words(self, ref: TileRef, rows: int, path):
        """A function from a row's C expression (within `rows`) to the C pointer of its bound word: `ref` is
        a global i32 tile [rows, 1] of a 2-d tensor (the `topk` shared bound, `topk_bound`'s bound)."""
        t = resolve_tile(self.k, ref)
        if t.space != "global" or t.dtype != "i32" or list(t.shape) != [rows, 1] or len(t.offset) != 2:
            self.fail(path, f"a bound is a global i32 tile [{rows}, 1] of a 2-d tensor (a word per row)")
        p = t.param
        off = [ix(o) for o in t.offset]
        return lambda row: f"({p.name} + ({self.gaddr(p, [f'({off[0]}) + ({row})', off[1]])}))"

    def given_bound(self, st, path):
        """st's given bound: an mma_rows f32 register tile [rows, 1] beside its lists."""
        gb, lists = self.reg_tile(st.given_bound, path), self.reg_tile(st.vals, path)
        if gb.layout != "mma_rows" or gb.dtype != "f32" or list(gb.shape) != [lists.shape[0], 1]:
            self.fail(path, f"a given bound is an mma_rows f32 tile [{lists.shape[0]}, 1] (a register per list row)")
        return gb

    def topk_acc_filtered(self, st: TopK, sb, vb, ib, TM: int, NT: int, K: int, mn: str, lim, path, wg: bool = False,
                          queue=None, bound=None):
        """topk (k > 1) over an mma_acc tile, filtered: a lane scores its 2 * NT columns of each row it
        holds without the row bias (u = scale * acc + col_bias, one FMA, the column bias read once for
        all rows; the scores take the accumulator's registers), takes their best per row and enters the
        per-element insertion only when that beats the row's threshold moved by the row bias (with a
        margin that covers the rounding of u + row_bias, so the filter never drops a score the exact
        test would take). The row's threshold is the best of the quad's k-th entries (the 4 lanes of a
        row's quad hold k entries each, so a score strictly worse than any lane's k-th never reaches
        the row's top-k after topk_merge) or the worst of their ceil(k / 4)-th entries (4 ceil(k / 4)
        >= k entries at least as good), the tighter; ties and everything that passes go on to the exact (value,
        index) test of topk_insert with the score v = u + row_bias. Most tiles then cost an FMA and a
        min per score and one compare per row; the limit is tested on the partial tile only. A lane that
        passes makes its whole warp run the insertion loop, so the threshold's tightness is the cost of
        large k (ncu: k = 16 ran 2x the instructions of k = 8): it also takes the worst of
        the quad's ceil(k / 4)-th entries.

        With a queue (T entries per row and lane), a passing score is pushed (2 T moves) unless the
        lane's queue is full (then inserted on the spot), and after the row's scan the warp flushes all
        queues together when any lane's is half full (E-TOPK-02: the merge flushes the rest). The
        threshold still comes from the lists alone: queued entries only make it looser, never wrong.

        With a shared bound (`bound`: (row -> its global word, the bound cache or None)), the quad's
        threshold is also published to the row's word when tighter, and the row's threshold is the
        tighter of the two (bound_share): another CTA's quad holds k entries at least that good. With a
        cache, the bound read by the previous tile is used and the next read issued (bound_share_cached)."""
        w = self.w
        n = 2 * NT
        slots = self.rows_slots(TM, wg)
        S = len(slots)
        worst = "cake::inf()" if mn == "true" else "(-cake::inf())"
        fold = "fminf" if mn == "true" else "fmaxf"
        passes = "<=" if mn == "true" else ">="
        quad = "cake::quad_min" if mn == "true" else "cake::quad_max"
        w.line(f"float cake_s[{S}][{n}];")
        w.line("#pragma unroll")
        w.open(f"for (int cake_n = 0; cake_n < {NT}; ++cake_n)")
        w.line("#pragma unroll")
        w.open("for (int cake_j = 0; cake_j < 2; ++cake_j)")
        if st.col_bias is not None:
            w.line(f"const float cake_cbv = {self.smem_f32(self.vec_addr(st.col_bias, 'cake_n * 8 + cake_c0 + cake_j', path))};")
        cb = "cake_cbv" if st.col_bias is not None else "0.0f"
        for slot, _ in slots:
            m, h = slot // 2, slot % 2
            w.line(f"cake_s[{slot}][cake_n * 2 + cake_j] = fmaf({float(st.scale)!r}f, "
                   f"{sb.name}[(({m}) * {NT} + cake_n) * 4 + {2 * h} + cake_j], {cb});")
        w.close()
        w.close()
        if lim:
            w.line(f"const int cake_rem = {lim} - cake_cb;   // columns c < cake_rem are in range")
            w.line("// a partial tile: columns past the limit never enter")
            w.open(f"if (cake_rem < {8 * NT})")
            w.line("#pragma unroll")
            w.open(f"for (int cake_i = 0; cake_i < {n}; ++cake_i)")
            w.open("if ((cake_i >> 1) * 8 + cake_c0 + (cake_i & 1) >= cake_rem)")
            w.line("#pragma unroll")
            w.line(f"for (int cake_h = 0; cake_h < {S}; ++cake_h) cake_s[cake_h][cake_i] = {worst};")
            w.close()
            w.close()
            w.close()
        for slot, row in slots:
            w.open("")
            w.line(f"float* cake_tv = &{vb.name}[{slot * K}];")
            w.line(f"int* cake_ti = &{ib.name}[{slot * K}];")
            # the row's threshold, an upper bound of its k-th best so far (whole warp here): the best of the
            # quad's k-th entries (that lane alone holds k better ones), or the worst of the quad's j-th
            # entries, j = ceil(k / 4), whichever is tighter (the 4 lanes hold 4 j >= k entries at least that
            # good): with 4 lanes of k each the first alone runs ~3x the k-th best, the pair ~1.7x
            J = -(-K // 4) - 1
            other = "cake::quad_max" if mn == "true" else "cake::quad_min"
            if self.quad_lists_disjoint(st):
                mine = f"{fold}({quad}(cake_tv[{K - 1}]), {other}(cake_tv[{J}]))"
            else:   # after a topk_merge the 4 lanes hold one list: only a lane's own k-th bounds the row
                mine = f"{quad}(cake_tv[{K - 1}])"
            if st.given_bound is not None:   # the bound known before the selection (NaN: none)
                mine = f"{fold}({mine}, {self.given_bound(st, path).name}[{slot}])"
            if bound is None:
                w.line(f"const float cake_thr = {mine};")
            elif bound[1] is None:
                w.line(f"const float cake_thr = cake::bound_share<{mn}>({bound[0](row)}, {mine}, cake_lane);")
            else:
                w.line(f"const float cake_thr = cake::bound_share_cached<{mn}>({bound[0](row)}, {mine}, cake_lane, "
                       f"{bound[1].name}[{slot}]);")
            if st.row_bias is not None:
                w.line(f"const float cake_rb = {self.smem_f32(self.vec_addr(st.row_bias, row, path))};")
                # fl(u + rb) passes thr => u passes thr - rb moved by half an ulp of thr; the margin
                # (2^-20 of the magnitudes, and an absolute floor) covers that and the rounding here
                sign = "+" if mn == "true" else "-"
                w.line(f"const float cake_thu = (cake_thr - cake_rb) {sign} ((fabsf(cake_thr) + fabsf(cake_rb)) * 9.5367431640625e-07f + 1e-30f);")
            else:
                w.line("const float cake_rb = 0.0f;")
                w.line("const float cake_thu = cake_thr;")
            w.line(f"float cake_best = cake_s[{slot}][0];")
            w.line("#pragma unroll")
            w.line(f"for (int cake_i = 1; cake_i < {n}; ++cake_i) cake_best = {fold}(cake_best, cake_s[{slot}][cake_i]);")
            if st.valid_rows is not None:   # a padding row: nothing passes (its lanes stay for the shuffles)
                w.line(f"if (!(({row}) < (int)({ix(st.valid_rows)}))) cake_best = {worst};")
            w.open(f"if (cake_best {passes} cake_thu)")
            guard = " && cake_c < cake_rem" if lim else ""
            if st.rolled:
                # the passing columns as bits (the same test on the same value as below), then one rolled loop
                # over them in increasing column order: a select chain reads the score from registers (a
                # run-time index into cake_s would put it in local memory)
                wide = n > 32     # (N = 256: 64 columns per lane and row)
                mt, one, ffs = ("unsigned long long", "1ull", "__ffsll") if wide else ("unsigned", "1u", "__ffs")
                w.line(f"{mt} cake_m = 0{'ull' if wide else 'u'};")
                w.line("#pragma unroll")
                w.open(f"for (int cake_i = 0; cake_i < {n}; ++cake_i)")
                w.line("const int cake_c = (cake_i >> 1) * 8 + cake_c0 + (cake_i & 1);")
                w.line(f"if (cake_s[{slot}][cake_i] + cake_rb {passes} cake_thr{guard}) cake_m |= {one} << cake_i;")
                w.close()
                w.line("#pragma unroll 1")
                w.open(f"for (; cake_m != 0{'ull' if wide else 'u'}; cake_m &= cake_m - {one})")
                w.line(f"const int cake_i = {ffs}(cake_m) - 1;")
                w.line(f"float cake_sv = cake_s[{slot}][0];")
                w.line("#pragma unroll")
                w.line(f"for (int cake_j = 1; cake_j < {n}; ++cake_j) if (cake_i == cake_j) cake_sv = cake_s[{slot}][cake_j];")
                w.line("const int cake_c = (cake_i >> 1) * 8 + cake_c0 + (cake_i & 1);")
                w.line("const float cake_v = cake_sv + cake_rb;")
                guard = ""
                passes_test = ""      # (every set bit passed the test)
            else:
                w.line("#pragma unroll")
                w.open(f"for (int cake_i = 0; cake_i < {n}; ++cake_i)")
                w.line("const int cake_c = (cake_i >> 1) * 8 + cake_c0 + (cake_i & 1);")
                w.line(f"const float cake_v = cake_s[{slot}][cake_i] + cake_rb;")
                passes_test = f"cake_v {passes} cake_thr"
            insert = f"cake::topk_insert<{K}, {mn}>(cake_tv, cake_ti, cake_v, cake_cb + cake_c);"
            cond = f"{passes_test}{guard}"
            if queue is None:
                w.line(f"if ({cond}) {insert}" if cond else insert)
            else:
                qv, qi, T = queue
                q_v, q_i = f"&{qv.name}[{slot * T}]", f"&{qi.name}[{slot * T}]"   # this row's queue
                w.open(f"if ({cond})" if cond else "")
                w.line(f"if ({qi.name}[{slot * T + T - 1}] >= 0) {insert}   // a full queue: on the spot")
                w.line(f"else cake::topk_push<{T}>({q_v}, {q_i}, cake_v, cake_cb + cake_c);")
                w.close()
            w.close()
            w.close()
            if queue is not None:
                # warp-uniform (outside the divergent scan): the lanes insert their queues together
                w.line(f"if (__any_sync(0xffffffffu, {qi.name}[{slot * T + max(T // 2, 1) - 1}] >= 0)) "
                       f"cake::topk_flush<{K}, {T}, {mn}>(cake_tv, cake_ti, {q_v}, {q_i});")
            w.close()

    def quad_lists_disjoint(self, st: TopK) -> bool:
        """The 4 lanes of a quad hold different candidates in st's lists when st runs: no topk_merge of
        those lists comes before st in program order or shares a loop with it (a merge leaves one list
        in all 4 lanes, where 4 lanes' j-th entries no longer stand for 4 j entries)."""
        sites = list(statements(self.k))
        me = next((s for s in sites if s.node is st), None)
        if me is None:
            return False
        for i, s in enumerate(sites):
            if isinstance(s.node, TopKMerge) and s.node.vals.buf == st.vals.buf:
                if s is not me and (sites.index(me) > i or any(a is b for a in s.loops for b in me.loops)):
                    return False
        return True

    @_robust
    def s_TopKMerge(self, st: TopKMerge, path):
        vb, ib = self.reg_tile(st.vals, path), self.reg_tile(st.idx, path)
        if vb.layout != "mma_rows" or ib.layout != "mma_rows" or list(vb.shape) != list(ib.shape):
            self.fail(path, "topk_merge merges equal-shaped mma_rows value and index lists")
        TM, K = vb.shape
        mn = "true" if st.kind == "min" else "false"
        queue = self.topk_queue(st, TM, path)
        for slot in range(TM // 8):
            if queue is not None:   # the pending entries of a deferred insertion go in first
                qv, qi, T = queue
                self.w.line(f"cake::topk_flush<{K}, {T}, {mn}>(&{vb.name}[{slot * K}], &{ib.name}[{slot * K}], "
                            f"&{qv.name}[{slot * T}], &{qi.name}[{slot * T}]);", path)
            self.w.line(f"cake::topk_merge_quad<{K}, {mn}>(&{vb.name}[{slot * K}], &{ib.name}[{slot * K}]);", path)

    def global_elem(self, ref: TileRef, dtype: str, what: str, path, op: str = "row_select") -> str:
        """The C pointer of a global tile's first element (a tensor param of `dtype`)."""
        t = resolve_tile(self.k, ref)
        if t.space != "global" or t.param is None or t.dtype != dtype:
            self.fail(path, f"{op}'s {what} is a global {dtype} tile")
        return f"({t.param.name} + ({self.gaddr(t.param, [ix(o) for o in t.offset])}))"

    @_robust
    def s_RowSelect(self, st: RowSelect, path):
        """One call of cake::row_select by the whole CTA (the role's threads are the CTA's)."""
        g = self.global_elem
        sb = self.buf(st.scratch.buf, path)
        if sb.space != "smem":
            self.fail(path, "row_select's scratch is an smem buffer")
        scratch = f"reinterpret_cast<unsigned*>(cake_smem + ({self.smem_byte(sb, st.scratch.slot, '0', '0')}))"
        T = self.role.threads if self.role is not None else self.k.launch.threads
        mn = "true" if st.kind == "min" else "false"
        sidx = g(st.src_idx, "i32", "src_idx", path) if st.src_idx is not None else "nullptr"
        rb = f"__ldg({g(st.row_bias, 'f32', 'row_bias', path)})" if st.row_bias is not None else "0.0f"
        cb = g(st.col_bias, "f32", "col_bias", path) if st.col_bias is not None else "nullptr"
        w = self.w
        w.open("", path)
        w.line(f"const cake::SelRow cake_row{{{g(st.src, 'f32', 'src', path)}, (int)({ix(st.count)}), "
               f"(int)({ix(st.col)}), {sidx}, {float(st.scale)!r}f, {rb}, {cb}}};")
        w.line(f"cake::row_select<{st.k}, {T}, {mn}>(cake_row, {g(st.vals, 'f32', 'vals', path)}, "
               f"{g(st.idx, 'i32', 'idx', path)}, {scratch});")
        w.close()

    @_robust
    def s_BucketOffsets(self, st: BucketOffsets, path):
        """One call of cake::bucket_offsets by the whole CTA (its scratch: a word a warp)."""
        ct = resolve_tile(self.k, st.counts).dtype
        if ct not in ("f32", "i32"):
            self.fail(path, "bucket_offsets' counts is a global f32 or i32 tile")
        sb = self.buf(st.scratch.buf, path)
        if sb.space != "smem":
            self.fail(path, "bucket_offsets' scratch is an smem buffer")
        scratch = f"reinterpret_cast<int*>(cake_smem + ({self.smem_byte(sb, st.scratch.slot, '0', '0')}))"
        g = self.global_elem
        self.w.line(f"cake::bucket_offsets<{self.k.launch.threads}>({g(st.counts, ct, 'counts', path, 'bucket_offsets')}, "
                    f"{g(st.dst, 'i32', 'dst', path, 'bucket_offsets')}, (int)({ix(st.count)}), {scratch});", path)

    @_robust
    def s_BucketPlace(self, st: BucketPlace, path):
        """cake::bucket_place over the role's threads."""
        def g(ref, what):
            return self.global_elem(ref, "i32", what, path, "bucket_place")
        self.w.line(f"cake::bucket_place({g(st.keys, 'keys')}, (int)({ix(st.count)}), (int)({ix(st.key_base)}), "
                    f"(int)({ix(st.id_base)}), {g(st.cursor, 'cursor')}, {g(st.ids, 'ids')}, "
                    f"{g(st.sorted_keys, 'sorted_keys')}, {self.scope_index('role')}, {self.scope_threads('role')});",
                    path)

    @_robust
    def s_SegmentSums(self, st: SegmentSums, path):
        """cake::segment_sums over the role's threads; D is the src tile's width, the row pitch of src and dst."""
        src, dst = resolve_tile(self.k, st.src), resolve_tile(self.k, st.dst)
        D = src.shape[-1] if src.shape else 0
        cst = dict(self.k.consts)
        for t, what in ((src, "src"), (dst, "dst")):
            p = t.param
            if p is None or len(p.shape) != 2 or p.strides or E.try_const(E.parse_index(p.shape[-1]), cst) != D \
                    or (t.shape and t.shape[-1] != D):
                self.fail(path, f"segment_sums' {what} is a tile of a contiguous 2-d global tensor whose rows are "
                          f"the src tile's width D = {D}")
        T = self.scope_threads("role")
        if D % 8 or not 8 <= D <= 8 * T:
            self.fail(path, f"segment_sums takes D a multiple of 8 up to 8 x the role's {T} threads (got D = {D})")
        g = self.global_elem
        self.w.line(f"cake::segment_sums<{D}, {st.unroll}>({g(st.src, 'f16', 'src', path, 'segment_sums')}, "
                    f"{g(st.ids, 'i32', 'ids', path, 'segment_sums')}, {g(st.keys, 'i32', 'keys', path, 'segment_sums')}, "
                    f"(int)({ix(st.p0)}), (int)({ix(st.count)}), {g(st.dst, 'f32', 'dst', path, 'segment_sums')}, "
                    f"{self.scope_index('role')}, {T});", path)

    @_robust
    def s_TopKBound(self, st: TopKBound, path):
        """load: each row slot's bound cache register takes its row's word (decoded; 0 = no bound, a NaN
        the filter's fminf / fmaxf ignore). store: the k-th entry of each row's list, as a key, into the
        row's word (mma_rows lists: lane 0 of the quad, which holds the merged list like the others)."""
        vb = self.reg_tile(st.vals, path)
        mn = "true" if st.kind == "min" else "false"
        w = self.w
        if vb.layout == "mma_rows":
            R, C = vb.shape
            word = self.bound_words(st.bound, R, path)
            if st.mode == "load" and C != 1:
                self.fail(path, f"topk_bound loads a bound cache [{R}, 1], not [{R}, {C}]")
            w.open("", path)
            for slot, row in self.rows_slots(R):
                if st.mode == "load":
                    w.line(f"{vb.name}[{slot}] = cake::bound_value<{mn}>((unsigned)__ldcg({word(row)}));")
                else:
                    w.line(f"if ((cake_lane & 3) == 0) *{word(row)} = (int)cake::bound_key<{mn}>({vb.name}[{slot * C + C - 1}]);")
            w.close()
        elif vb.layout == "row_major" and vb.scope == "thread" and st.mode == "store":
            C = vb.shape[-1]
            if prod(vb.shape) != C:
                self.fail(path, "topk_bound stores a per-thread [1, k] list's k-th entry into a bound tile [1, 1]")
            word = self.bound_words(st.bound, 1, path)
            w.line(f"*{word('0')} = (int)cake::bound_key<{mn}>({vb.name}[{C - 1}]);", path)
        else:
            self.fail(path, "topk_bound loads an mma_rows bound cache [rows, 1], or stores the k-th entry of an "
                      "mma_rows [rows, k] or per-thread row_major [1, k] list")

    @_robust
    def store_rows(self, st: Access, rb: Buffer, mem, path):
        """stg / sts of an mma_rows list tile [TM, k] (a row's quad holds one list, e.g. after topk_merge):
        lane q of the quad writes columns c = q mod 4."""
        if st.row_limit is not None:
            self.fail(path, "row_limit is not lowered for mma_rows stores (mask with oob against the tensor)")
        TM, K = rb.shape
        if mem.space == "smem":
            if len(mem.shape) != 2 or list(mem.shape) != [TM, K]:
                self.fail(path, f"an mma_rows [{TM}, {K}] sts writes an smem tile of the same shape")
            r0, c0, _, _ = self.tile_rc(mem, path)
            b = mem.buffer
            w = self.w
            w.open("", path)
            w.line("const int cake_q = cake_lane & 3;")
            for slot, row in self.rows_slots(TM):
                val = self.to_storage(b.dtype, self.from_storage(rb.dtype, f"{rb.name}[{slot * K} + cake_c]"))
                addr = self.smem_byte(b, mem.ref.slot, f"{r0} + {row}", f"{c0} + cake_c")
                w.line("#pragma unroll")
                w.open(f"for (int cake_c = 0; cake_c < {K}; ++cake_c)")
                w.line(f"if ((cake_c & 3) == cake_q) *reinterpret_cast<{STORAGE[b.dtype]}*>(cake_smem + ({addr})) = {val};",
                       path)
                w.close()
            w.close()
            return
        if mem.space != "global":
            self.fail(path, "mma_rows tiles are stored to global tensors or shared memory")
        p = mem.param
        off = list(mem.offset)
        n = len(off)
        along_last = K == 1 and mem.shape and mem.shape[-1] == TM and (n == 1 or mem.shape[-2] == 1)
        if not along_last and n < 2:
            self.fail(path, f"an mma_rows [{TM}, {K}] store needs a tile of >= 2 dims (rows, k)")
        mask = st.oob in ("mask", "zfill")
        w = self.w
        w.open("", path)
        w.line("const int cake_q = cake_lane & 3;")
        for slot, row in self.rows_slots(TM):
            if along_last:
                idx = [ix(o) for o in off[:-1]] + [f"{ix(off[-1])} + {row}"]
                conds = [f"({idx[-1]}) < ({ix(p.shape[-1])})"]
                col = None
            else:
                idx = [ix(o) for o in off[:-2]] + [f"{ix(off[-2])} + {row}", f"{ix(off[-1])} + cake_c"]
                conds = [f"({idx[-2]}) < ({ix(p.shape[-2])})", f"({idx[-1]}) < ({ix(p.shape[-1])})"]
                col = True
            val = f"{rb.name}[{slot * K} + cake_c]"
            if rb.dtype != p.dtype:
                val = self.to_storage(p.dtype, self.from_storage(rb.dtype, val))
            store = f"{p.name}[{self.gaddr(p, idx)}] = {val};"
            guard = " && ".join(conds) if mask else ""
            w.line("#pragma unroll")
            w.open(f"for (int cake_c = 0; cake_c < {K}; ++cake_c)")
            who = "(cake_c & 3) == cake_q" if col else "cake_q == 0"
            w.line(f"if ({who}{' && ' + guard if guard else ''}) {store}", path)
            w.close()
        w.close()

    def load_rows(self, st: Access, rb: Buffer, mem, path):
        """ldg / lds into an mma_rows tile [TM, k] (per-row values beside an mma_acc tile: beta, a decay,
        a row scale): each lane loads the rows it holds (g and g + 8 of every 16-row tile), all k entries.
        A [TM, 1] tile may come from a tile whose last dim runs along the rows ([.., TM])."""
        TM, K = rb.shape
        off = list(mem.offset)
        along_last = K == 1 and mem.shape and mem.shape[-1] == TM and (len(mem.shape) == 1 or mem.shape[-2] == 1)
        if not along_last and len(mem.shape) < 2:
            self.fail(path, f"an mma_rows [{TM}, {K}] load needs a tile of >= 2 dims (rows, k)")
        w = self.w
        w.open("", path)
        for slot, row in self.rows_slots(TM):
            w.line("#pragma unroll")
            w.open(f"for (int cake_c = 0; cake_c < {K}; ++cake_c)")
            if mem.space == "global":
                p = mem.param
                if along_last:
                    idx = [ix(o) for o in off[:-1]] + [f"{ix(off[-1])} + {row}"]
                else:
                    idx = [ix(o) for o in off[:-2]] + [f"{ix(off[-2])} + {row}", f"{ix(off[-1])} + cake_c"]
                val = self.row_value(p.dtype, rb.dtype, f"{p.name}[{self.gaddr(p, idx)}]")
                if st.oob in ("mask", "zfill"):
                    conds = " && ".join(f"({i}) < ({ix(d)})" for i, d in zip(idx, p.shape))
                    val = f"(({conds}) ? {val} : {'0' if p.dtype == rb.dtype else '0.0f'})"
            else:
                r0, c0, _, _ = self.tile_rc(mem, path)
                r_c, c_c = (r0, f"{c0} + {row}") if along_last else (f"{r0} + {row}", f"{c0} + cake_c")
                b = mem.buffer
                ptr = f"reinterpret_cast<const {STORAGE[b.dtype]}*>(cake_smem + ({self.smem_byte(b, mem.ref.slot, r_c, c_c)}))"
                val = self.row_value(b.dtype, rb.dtype, f"(*{ptr})")
            w.line(f"{rb.name}[{slot * K} + cake_c] = {val};", path)
            w.close()
        w.close()

    def row_value(self, src_dtype: str, dst_dtype: str, x: str) -> str:
        """A loaded element for a register of dst_dtype: as is where the types match (an i32 through a float
        would round past 2^24), else converted through float."""
        if src_dtype == dst_dtype:
            return x
        return self.to_storage(dst_dtype, self.from_storage(src_dtype, x))

    @_robust
    def reduce_smem(self, st: Reduce, path):
        """sum / sum_sq of the rows of an smem tile [R, C] into an smem f32 vector, a row per thread
        (16-byte chunks along the row: conflict-free on 128B-swizzled rows)."""
        src, dst = resolve_tile(self.k, st.src), resolve_tile(self.k, st.dst)
        sb, db = src.buffer, dst.buffer
        if st.kind not in ("sum", "sum_sq") or db is None or db.space != "smem" or len(src.shape) != 2:
            self.fail(path, "an smem reduce is sum or sum_sq of a 2-d smem tile into an smem f32 vector")
        R, C = src.shape
        es = SIZE[sb.dtype]
        V = max(1, 16 // es)
        if C % V:
            V = 1
        T = self.scope_threads(st.scope)   # (the prologue, outside any role, indexes the CTA's threads)
        t = "cake_tid" if st.scope == "role" and self.role is None else self.scope_index(st.scope)
        row, col, _, _ = self.tile_rc(src, path)
        vt = {16: "uint4", 8: "uint2", 4: "unsigned", 2: "unsigned short"}[V * es]
        w = self.w
        w.open(f"for (int cake_r = {t}; cake_r < {R}; cake_r += {T})", path)
        # a warp's own tile (scope warp / thread): four partial sums (element j of each chunk into sum
        # j % 4), four dependent FMA chains a quarter as long as one, which a warp alone on its SM
        # sub-partition (the kNN stream) otherwise waits on; a role's rows keep one sum (many warps hide it)
        parts = 4 if st.scope in ("warp", "thread") else 1
        w.line("float cake_acc4[4] = {0.0f, 0.0f, 0.0f, 0.0f};" if parts == 4 else "float cake_acc = 0.0f;")
        w.line("#pragma unroll 4")
        w.open(f"for (int cake_c = 0; cake_c < {C}; cake_c += {V})")
        addr = self.smem_byte(sb, st.src.slot, f"{row} + cake_r", f"{col} + cake_c")
        w.line(f"const {vt} cake_v = *reinterpret_cast<const {vt}*>(cake_smem + ({addr}));")
        w.line(f"const {STORAGE[sb.dtype]}* cake_h = reinterpret_cast<const {STORAGE[sb.dtype]}*>(&cake_v);")
        w.line("#pragma unroll")
        x = self.from_storage(sb.dtype, "cake_h[cake_j]")
        term = f"cake::sq({x})" if st.kind == "sum_sq" else x
        acc = "cake_acc4[cake_j & 3]" if parts == 4 else "cake_acc"
        w.line(f"for (int cake_j = 0; cake_j < {V}; ++cake_j) {acc} += {term};")
        w.close()
        if parts == 4:
            w.line("const float cake_acc = (cake_acc4[0] + cake_acc4[1]) + (cake_acc4[2] + cake_acc4[3]);")
        op = "+=" if st.accumulate else "="
        w.line(f"*reinterpret_cast<float*>(cake_smem + ({self.vec_addr(st.dst, 'cake_r', path)} - cake_smem_base)) {op} cake_acc;")
        w.close()

    def elem_ptr(self, t, r_c: str, c_c: str, path) -> tuple[str, str]:
        """('global'|'shared', pointer or shared address) of element (r, c) of a 2-d-viewed tile."""
        if t.space == "global":
            p = t.param
            off = list(t.offset)
            idx = [ix(o) for o in off[:-2]] + [f"{ix(off[-2])} + {r_c}", f"{ix(off[-1])} + {c_c}"] if len(off) >= 2 \
                else [f"{ix(off[0])} + {r_c}"]
            return "global", f"({p.name} + ({self.gaddr(p, idx)}))"
        b = t.buffer
        row, col, _, _ = self.tile_rc(t, path)
        return "shared", f"(cake_smem_base + {self.smem_byte(b, t.ref.slot, f'{row} + {r_c}', f'{col} + {c_c}')})"

    @_robust
    def s_OneHot(self, st: OneHot, path):
        """The transposed one-hot matrix as an mma_a fragment: a lane holds rows g / g + 8 and columns
        2t, 2t + 1 (+ 8) of each 16x16 block (register r of a block: row half r % 2, column half r / 2,
        the ldmatrix_x4 order), so it reads the targets of its 4 columns per k-block once and compares
        them with its rows' target numbers (onehot_f16x2)."""
        db = self.reg_tile(st.dst, path)
        if db.layout != "mma_a" or db.dtype not in ("f16", "bf16") or len(db.shape) != 2 \
                or db.shape[0] % 16 or db.shape[1] % 16 or db.shape[0] > 256:
            self.fail(path, "onehot builds an f16 / bf16 mma_a fragment [16 i, 16 j] of at most 256 rows")
        idx = resolve_tile(self.k, st.index)
        C = db.shape[1]
        if not idx.known or idx.space != "smem" or idx.dtype != "i32" or prod(idx.shape) != C:
            self.fail(path, f"onehot reads {C} i32 targets (one per fragment column) from shared memory")
        r0, c0, rows, _ = self.tile_rc(idx, path)
        self.onehot_f16x2(st, db, idx, r0, c0, rows, db.shape[0] // 16, C // 16, path)

    def onehot_target(self, st: OneHot, idx, r0, c0, rows: int, j: str) -> str:
        """The i32 target of fragment column j (a [C, 1] or [1, C] smem index tile)."""
        rc = (f"{r0} + {j}", c0) if rows > 1 else (r0, f"{c0} + {j}")
        return f"(*reinterpret_cast<const int*>(cake_smem + ({self.smem_byte(idx.buffer, st.index.slot, *rc)})))"

    def onehot_f16x2(self, st: OneHot, db, idx, r0, c0, rows: int, MT: int, KT: int, path):
        """onehot with one f16x2 compare per register: a lane turns its 4 column targets per 16-column
        block into targets relative to its first row (target - row0 - g; -1 for a column past `limit`)
        and packs them as two f16x2 pairs once; register r of row tile mt (two columns of the row
        R = 16 mt + 8 (r & 1) below the lane's first) is then set.eq.f16x2 of its pair against the
        constant R: 1.0 where equal, the f16 one-hot pair (bf16: 1.0's bits by a shift and a LOP).
        Exact for row offsets R < 256 (E-HOT-01 holds fragments to 256 rows): the relative targets are
        integers, f16 holds them exactly up to 2048 and rounds larger magnitudes to values >= 2048, never
        onto an R; -1 is below every R."""
        w = self.w
        w.open("", path)
        w.line("const int cake_g = cake_lane >> 2, cake_t2 = (cake_lane & 3) * 2;")
        w.line(f"const int cake_tr0 = (int)({ix(st.row0)}) + cake_g;   // the target of the lane's first row")
        if st.limit is not None:
            w.line(f"const int cake_cl = (int)({ix(st.limit)}) - (int)({ix(st.col0)});")
        for kt in range(KT):
            for h, off in enumerate((0, 1, 8, 9)):
                j = f"{kt * 16 + off} + cake_t2"
                val = self.onehot_target(st, idx, r0, c0, rows, j)
                rel = f"({j}) < cake_cl ? {val} - cake_tr0 : -1" if st.limit is not None else f"{val} - cake_tr0"
                w.line(f"const int cake_d{kt}_{h} = {rel};")
            w.line(f"const unsigned cake_p{kt}_0 = cake::i2h2(cake_d{kt}_0, cake_d{kt}_1);   // columns 2t, 2t + 1")
            w.line(f"const unsigned cake_p{kt}_1 = cake::i2h2(cake_d{kt}_2, cake_d{kt}_3);   // columns 2t + 8, 2t + 9")
            for mt in range(MT):
                for r in range(4):
                    R = mt * 16 + (r & 1) * 8
                    rbits = struct.unpack("<H", struct.pack("<e", float(R)))[0]
                    cmp = f"cake::heq2(cake_p{kt}_{r >> 1}, 0x{rbits | rbits << 16:08X}u)"
                    if db.dtype == "bf16":
                        cmp = f"cake::h1_to_bf1({cmp})"
                    w.line(f"{db.name}[{(mt * KT + kt) * 4 + r}] = {cmp};   // row {R} + g", path)
        w.close()

    @_robust
    def s_ScatterAdd(self, st: ScatterAdd, path):
        ib = self.reg_tile(st.index, path)
        if ib.layout != "mma_rows" or ib.shape[-1] != 1 or ib.dtype != "i32":
            self.fail(path, "scatter_add takes its target rows from an i32 mma_rows [R, 1] tile")
        TM = ib.shape[0]
        dst = resolve_tile(self.k, st.dst)
        if not dst.known or dst.space not in ("global", "smem"):
            self.fail(path, "scatter_add adds into an smem or global tile")
        src = resolve_tile(self.k, st.src) if st.src is not None else None
        C = src.shape[-1] if src is not None else 1
        if C % 4 and src is not None:
            self.fail(path, f"scatter_add splits a row's {C} columns over 4 lanes: use a multiple of 4")
        CQ = C // 4 if src is not None else 1
        w = self.w
        w.open("", path)
        w.line("const int cake_q = cake_lane & 3;")
        w.line(f"const int cake_row0 = (int)({ix(st.row0)});")
        for slot, row in self.rows_slots(TM):
            w.open("")
            w.line(f"const int cake_r = {row};")
            w.line(f"const int cake_t = {ib.name}[{slot}];")
            cond = "cake_t >= 0"
            if st.row_limit is not None:
                cond += f" && cake_row0 + cake_r < (int)({ix(st.row_limit)})"
            if src is None:
                cond += " && cake_q == 0"
            w.open(f"if ({cond})")
            if src is None:
                sp, dp = self.elem_ptr(dst, "cake_t", "0", path)
                one = "1.0f" if dst.dtype == "f32" else "1"
                fn = "red_add_global" if sp == "global" else "red_add_shared"
                w.line(f"cake::{fn}({dp}, {one});", path)
            elif st.batch > 1 and dst.space == "smem" and dst.dtype == "f32" and CQ % st.batch == 0:
                # batches of overlapped CAS adds (cake::red_add_shared_f32xn): see cake.cuh
                NB = st.batch
                rot = f"(cake_i + cake_lane) & {CQ - 1}" if CQ & (CQ - 1) == 0 else f"(cake_i + cake_lane) % {CQ}"
                w.open(f"for (int cake_i0 = 0; cake_i0 < {CQ}; cake_i0 += {NB})")
                w.line(f"unsigned cake_a[{NB}]; float cake_x[{NB}];")
                w.line("#pragma unroll")
                w.open(f"for (int cake_j = 0; cake_j < {NB}; ++cake_j)")
                w.line("const int cake_i = cake_i0 + cake_j;")
                w.line(f"const int cake_c = cake_q * {CQ} + ({rot});")
                ssp, sptr = self.elem_ptr(src, "cake_r", "cake_c", path)
                x = f"(*{sptr})" if ssp == "global" else \
                    f"(*reinterpret_cast<const {STORAGE[src.dtype]}*>(cake_smem + ({sptr} - cake_smem_base)))"
                x = self.from_storage(src.dtype, x)
                _, dptr = self.elem_ptr(dst, "cake_t", "cake_c", path)
                w.line(f"cake_a[cake_j] = {dptr}; cake_x[cake_j] = {x};")
                w.close()
                w.line(f"cake::red_add_shared_f32xn<{NB}>(cake_a, cake_x);", path)
                w.close()
            elif st.vec > 1:
                self.scatter_add_vec(st, src, dst, CQ, path)
            else:
                w.line("#pragma unroll 8")
                w.open(f"for (int cake_i = 0; cake_i < {CQ}; ++cake_i)")
                # rotate each lane's column walk by its lane id: the 32 lanes then touch 32 different
                # banks per instruction (unrotated they all hit bank i and the atomics serialise:
                # docs/perf-log.md, kmeans 2026-11-30)
                rot = f"(cake_i + cake_lane) & {CQ - 1}" if CQ & (CQ - 1) == 0 else f"(cake_i + cake_lane) % {CQ}"
                w.line(f"const int cake_c = cake_q * {CQ} + ({rot});")
                ssp, sptr = self.elem_ptr(src, "cake_r", "cake_c", path)
                if ssp == "global":
                    x = f"(*{sptr})"
                else:
                    x = f"(*reinterpret_cast<const {STORAGE[src.dtype]}*>(cake_smem + ({sptr} - cake_smem_base)))"
                x = self.from_storage(src.dtype, x)
                dsp, dptr = self.elem_ptr(dst, "cake_t", "cake_c", path)
                fn = "red_add_global" if dsp == "global" else "red_add_shared"
                w.line(f"cake::{fn}({dptr}, {x});", path)
                w.close()
            w.close()
            w.close()
        w.close()

    def scatter_add_vec(self, st, src, dst, CQ: int, path) -> None:
        """A lane's CQ columns of one row as CQ / vec vector reds (red.global.add.v2 / .v4.f32) of vec
        consecutive columns each, the quad's groups interleaved along the row."""
        V = st.vec
        if dst.space != "global" or dst.dtype != "f32" or CQ % V:
            self.fail(path, f"scatter_add vec={V} adds groups of {V} f32 columns into a global tile: each lane's "
                      f"{CQ} columns must split into them")
        w, G = self.w, CQ // V
        # group i of the quad's lane q: columns V (4 i + q) .. + V, so each red instruction covers 4 V contiguous
        # columns of a row (lane-contiguous runs of CQ columns would spread it over 4 half-used sectors)
        col = f"const int cake_c = {V} * (cake_i * 4 + cake_q);"
        # every group's loads first (plain C++, free to be scheduled together), then the reds: a red is an asm
        # statement with a memory clobber, so loads interleaved with them wait out one round trip each
        w.line(f"float cake_x[{G}][{V}];")
        w.line("#pragma unroll")
        w.open(f"for (int cake_i = 0; cake_i < {G}; ++cake_i)")
        w.line(col)
        ptrs = [self.src_elem(src, j, path) for j in range(V)]
        if st.load_vec and V == 4 and src.dtype in ("f16", "bf16"):
            w.line("unsigned short cake_h[4];")
            w.line(f"cake::ld_u16x4({', '.join(ptrs)}, cake_h[0], cake_h[1], cake_h[2], cake_h[3]);", path)
            xs = [self.from_storage(src.dtype, f"cake_h[{j}]") for j in range(V)]
        else:
            xs = [self.from_storage(src.dtype, f"(*{p})") for p in ptrs]
        w.line(" ".join(f"cake_x[cake_i][{j}] = {x};" for j, x in enumerate(xs)))
        w.close()
        w.line("#pragma unroll")
        w.open(f"for (int cake_i = 0; cake_i < {G}; ++cake_i)")
        w.line(col)
        _, dptr = self.elem_ptr(dst, "cake_t", "cake_c", path)
        w.line(f"cake::red_add_global_v{V}({dptr}, {', '.join(f'cake_x[cake_i][{j}]' for j in range(V))});", path)
        w.close()

    def src_elem(self, src, j: int, path) -> str:
        """A typed pointer to column cake_c + j of scatter_add's src row cake_r (global, or smem by its offset)."""
        ssp, sptr = self.elem_ptr(src, "cake_r", f"cake_c + {j}", path)
        if ssp == "global":
            return f"({sptr})"
        return f"reinterpret_cast<const {STORAGE[src.dtype]}*>(cake_smem + ({sptr} - cake_smem_base))"

    @_robust
    def s_RedAdd(self, st: RedAdd, path):
        src, dst = resolve_tile(self.k, st.src), resolve_tile(self.k, st.dst)
        if src.space == "reg" and dst.space == "global" and src.buffer is not None \
                and src.buffer.layout in ("mma_acc", "wgmma_acc"):
            return self.red_add_acc(st, src, dst, path)
        if src.space != "smem" or dst.space != "global" or len(src.shape) != 2:
            self.fail(path, "red_add adds a 2-d smem tile or an accumulator register tile (mma_acc / wgmma_acc) "
                      "into a global tile")
        R, C = src.shape
        T = self.scope_threads(st.scope)
        t = self.scope_index(st.scope)
        w = self.w
        w.open(f"for (int cake_i = {t}; cake_i < {R * C}; cake_i += {T})", path)
        w.line(f"const int cake_r = cake_i / {C}, cake_c = cake_i % {C};")
        if st.row_limit is not None:
            w.line(f"if (cake_r >= (int)({ix(st.row_limit)})) break;")
        _, sptr = self.elem_ptr(src, "cake_r", "cake_c", path)
        ct = STORAGE[src.dtype]
        w.line(f"const {ct} cake_x = *reinterpret_cast<const {ct}*>(cake_smem + ({sptr} - cake_smem_base));")
        _, dptr = self.elem_ptr(dst, "cake_r", "cake_c", path)
        w.line(f"if (cake_x != ({ct})0) cake::red_add_global({dptr}, cake_x);", path)
        w.close()

    def red_add_acc(self, st: RedAdd, src, dst, path):
        """red_add from an mma_acc tile [M, N] (or a warpgroup's wgmma_acc [64, N]: warp w its rows 16 w ..):
        each lane adds its own elements (acc_coords) at their place in the global tile -- an accumulator
        flushed without a trip through shared memory."""
        rb = src.buffer
        TM, TN = rb.shape
        wg = rb.layout == "wgmma_acc"
        if wg and TM != 64:
            self.fail(path, f"red_add from a wgmma_acc tile takes a warpgroup's [64, N], not [{TM}, {TN}]")
        if dst.shape and list(dst.shape) != [TM, TN]:      # (no shape: the whole tensor)
            self.fail(path, f"red_add from an accumulator [{TM}, {TN}] goes into a global tile of that shape, not "
                      f"{list(dst.shape)}")
        w = self.w
        w.open("", path)
        w.line("#pragma unroll")
        w.open(f"for (int cake_e = 0; cake_e < {self.reg_count(rb)}; ++cake_e)")
        self.acc_coords(TN)
        row = "(cake_row + 16 * (cake_wg_tid >> 5))" if wg else "cake_row"
        if st.row_limit is not None:
            w.line(f"if ({row} >= (int)({ix(st.row_limit)})) continue;")
        _, dptr = self.elem_ptr(dst, row, "cake_col", path)
        w.line(f"if ({rb.name}[cake_e] != 0.0f) cake::red_add_global({dptr}, {rb.name}[cake_e]);", path)
        w.close()
        w.close()

    @_robust
    def s_LastCta(self, st: LastCta, path):
        ptr = self.counter_ptr(st, path)
        w = self.w
        w.open("", path)
        w.line("__shared__ int cake_last;")
        self.release_before_arrival()
        w.line(f"if (cake_tid == 0) cake_last = cake::arrive_last({ptr}, (int)({ix(st.count)}));", path)
        w.line("__syncthreads();")
        w.open("if (cake_last)")
        w.line("__threadfence();   // acquire: the other CTAs' writes are visible")
        self.stmts(st.body, path + "/body")
        w.close()
        w.close()

    @_robust
    def s_ArriveWait(self, st: ArriveWait, path):
        ptr = self.counter_ptr(st, path)
        w = self.w
        w.open("", path)
        self.release_before_arrival()
        w.line(f"if (cake_tid == 0) cake::arrive({ptr});", path)
        w.open(f"if ({cond_c(st.when)})", path + "/when")
        w.line(f"if (cake_tid == 0) cake::wait_arrivals({ptr}, (int)({ix(st.count)}));", path)
        w.line("__syncthreads();")
        w.line("__threadfence();   // acquire: the arrived CTAs' writes are visible")
        self.stmts(st.body, path + "/body")
        w.line("__syncthreads();   // the body done in every thread before the counter may reset")
        w.line(f"if (cake_tid == 0) cake::depart({ptr}, (int)({ix(st.count)}) + (int)({ix(st.waiters)}));", path)
        w.close()
        w.close()

    def release_before_arrival(self) -> None:
        """Every thread fences its own global writes (the red.add flushes are spread over all threads), then
        the barrier makes all those fences complete before thread 0 arrives on a grid counter; fencing after
        the barrier let thread 0 arrive while other threads' reductions were still in flight."""
        self.w.line("__threadfence();   // release this thread's global writes ...")
        self.w.line("__syncthreads();   // ... and everyone's, before arriving")

    def counter_ptr(self, st: LastCta, path) -> str:
        """The address of a last_cta / arrive_wait counter (an i32 global tensor element)."""
        t = resolve_tile(self.k, st.counter)
        if t.space != "global" or t.dtype != "i32":
            self.fail(path, f"{st.op} counts arrivals on an i32 global tensor element")
        p = t.param
        return f"({p.name} + ({self.gaddr(p, [ix(o) for o in t.offset])}))"

    def scope_barrier(self, scope: str, path) -> str:
        if scope == "cta" or (scope == "role" and self.role is not None and self.role.threads == self.k.launch.threads):
            return "__syncthreads();"
        if scope == "role":
            return f"cake::bar_sync({15 - (self.role_index or 0)}, {self.role.threads});"
        self.fail(path, f"{scope}-wide reductions need a role- or CTA-wide tile")

    def s_Scan(self, st: Scan, path):
        sb, db = self.reg_tile(st.src, path), self.reg_tile(st.dst, path)
        if sb.layout == "blocked" and st.axis < len(sb.shape) - 1:
            return self.scan_rows(st, sb, db, path)
        if not (sb.layout == "row_major" and sb.scope == "thread"):
            self.fail(path, "scan is lowered for per-thread (row_major, scope thread) tiles and along the rows "
                            "of blocked tiles")
        C = sb.shape[-1]
        R = prod(sb.shape[:-1])
        self.emit_scan(st, sb, db, R, C, "cake_r * {C} + cake_c".format(C=C), path)

    def scan_rows(self, st: Scan, sb: Buffer, db: Buffer, path):
        """A scan down the rows (all leading dims flattened) of a blocked tile whose rows each span the
        scope evenly: every lane then holds the same columns of every row, K / T registers per row, so
        the scan is a per-lane running sum over its rows (a cumulative gate over the tokens of a chunk)."""
        T = self.scope_threads(sb.scope)
        C = sb.shape[-1]
        if C % (T * sb.vec) or db.layout != "blocked" or list(db.shape) != list(sb.shape) or db.vec != sb.vec \
                or db.scope != sb.scope:
            self.fail(path, f"a scan along the rows of a blocked tile needs rows that split evenly over the "
                            f"{T} threads of its scope (last dim a multiple of {T * sb.vec}) and a destination "
                            f"of the same shape and layout")
        R, n = prod(sb.shape[:-1]), C // T
        self.emit_scan(st, sb, db, n, R, f"cake_c * {n} + cake_r", path)

    def emit_scan(self, st: Scan, sb: Buffer, db: Buffer, R: int, C: int, idx: str, path):
        """R independent running scans of C steps each; element (cake_r, cake_c) at register `idx`."""
        op = "+" if st.kind == "sum" else "max"
        w = self.w
        w.open("", path)
        w.line("#pragma unroll")
        w.open(f"for (int cake_r = 0; cake_r < {R}; ++cake_r)")
        w.line(f"float cake_run = {'0.0f' if st.kind == 'sum' else '(-cake::inf())'};")
        w.line("#pragma unroll")
        w.open(f"for (int cake_c = 0; cake_c < {C}; ++cake_c)")
        src = self.from_storage(sb.dtype, f"{sb.name}[{idx}]")
        nxt = f"cake_run + cake_x" if op == "+" else "fmaxf(cake_run, cake_x)"
        w.line(f"const float cake_x = {src};")
        if st.exclusive:
            w.line(f"{db.name}[{idx}] = {self.to_storage(db.dtype, 'cake_run')};")
            w.line(f"cake_run = {nxt};")
        else:
            w.line(f"cake_run = {nxt};")
            w.line(f"{db.name}[{idx}] = {self.to_storage(db.dtype, 'cake_run')};")
        w.close()
        w.close()
        w.close()


def lower(kernel: Kernel) -> Lowered:
    """Lower an expanded kernel to CUDA C++. Unsupported constructs become E-LOWER-* diagnostics."""
    em = Emitter(kernel)
    try:
        return em.emit()
    except LowerError as e:
        d = Diagnostic(code="E-LOWER-UNSUPPORTED", node=e.path, message=str(e))
        return Lowered("", {}, kernel.name, [], em.plan.total, em.plan, [d])
    except SourceTooLarge as e:
        d = Diagnostic(code="E-LOWER-UNSUPPORTED", node=em.cur, message=f"{e} (tile sizes too large to unroll?)")
        return Lowered("", {}, kernel.name, [], em.plan.total, em.plan, [d])
    except (E.ExprError, RecursionError) as e:  # RecursionError: substituted lets built a too-deep tree
        d = Diagnostic(code="E-LOWER-EXPR", node=em.cur, message=str(e) or "expression nests too deeply")
        return Lowered("", {}, kernel.name, [], em.plan.total, em.plan, [d])
