"""An analytical cost model for CAKE IR kernels.

`estimate(kernel, shapes, constants)` predicts the run time of one launch and says which term binds
and at which node. It is meant to rank candidates and explain them, not to replace measurement.

What it counts (per CTA, for a representative CTA in the middle of the grid):
  * global bytes of every copy / ldg / stg, by mechanism (tma, bulk, cp_async, ldg, stg, sync), times the
    number of scope groups executing the statement and the trip counts of its enclosing loops
    (symbolic loop bounds and grid sizes are evaluated with `shapes`);
  * tensor FLOPs: 2*M*N*K per mma_sync / wgmma tile (K = the operand slab the statement covers);
  * SIMT work: element-wise ops of map / fill / reduce / scan, SFU ops (exp2, log2, rsqrt, ...);
  * shared-memory bytes of lds / sts / ldmatrix / cp.async and warp-instruction issue slots;
  * load latency streams: loads grouped by role and innermost loop, with their stage depth
    (a pipeline's `stages`, an mbarrier array's `count`, `cp_async_wait n` -> n+1, `unroll`).

Occupancy: blocks per SM = min(threads, shared memory (passes.plan_smem on the expanded kernel plus
the per-block reservation `smem_per_sm - smem_per_block_max`), registers (role `regs`, else an estimate
from the register tiles a role touches), the hardware block limit). A wave holds R = min(blocks left,
sms * blocks_per_sm) CTAs, k = ceil(R / sms) per SM.

Per wave (every term is the time the wave needs if only that resource mattered):
    compute  = k * max(tensor_flops / (rate / sms), simt_ops / (fp32_flops / 2 / sms), sfu / (sfu_ops / sms))
    memory   = max(R * bytes * dram_fraction / hbm_bw,  k * bytes / (l2_bw / sms))
    issue    = max(k * warp_instrs / (4 * clock_hz),  k * smem_bytes / smem_bw_per_sm)
    steady   = max over pipelined streams of iters * (latency + mbarrier_roundtrip) / stages
    serial   = the busiest warp's own instructions * warp_issue_cycles / clock_hz (a role's instructions
               shared by its warps; a loop whose bounds depend on the warp, such as a producer taking
               every P-th chunk, counts its mean trip count over the role's warps). With `sass` (the
               compiled code's static instructions per node) a warp's count is sum(static x executions
               per warp): the chunked KDA kernels then land within ~10% of their H200 times (4 cycles
               per instruction); code with more independent work per warp runs faster than that
    T        = max(compute, memory, issue, steady, serial)
    X        = per-CTA exposed latency: first fill of each pipelined stream (one latency) plus
               iters * latency for every unpipelined stream (stages == 1), summed over a role's
               streams, max over roles (roles run concurrently)
    wave     = T + X                      (first wave: nothing hides its latency)
             = max(T, T / k + X)          (later waves: other resident CTAs hide a CTA's latency)
  time = launch_overhead_s + sum over waves.
`dram_fraction` is the share of the CTAs' global traffic that reaches HBM: per tensor, min(traffic,
footprint) (re-reads of a tensor are assumed to hit L2). The four reported terms are the sums over the
waves of compute, memory and issue, and of `latency` = wave - max(compute, memory, issue) plus the
launch overhead; `bound` is the largest. Every term names the node that contributes most to it
(`term_paths`); each per-node entry carries its share of every term.

Constants come only from `ArchSpec` fields (cake_ir/arch.py), optionally overridden by calibration
data: `load_constants("h200")` reads calibration/data/h200.json. Structural facts that are not rates
(4 warp schedulers per SM, 512 bytes per ldmatrix.x4) are named module constants.
Nothing here raises on a verified kernel: whatever cannot be evaluated falls back to a documented
default and is listed in `report.assumptions`.

A Program (kernels launched in order on one stream) is estimated kernel by kernel: its report sums
the times, terms, traffic and launch overheads (each kernel pays its own launch), takes the largest
shared memory, reports the launch shape and bound of the slowest kernel, and keeps every kernel's
own report in `kernels` (node paths in the program report carry `/kernels/{i}`).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from . import arch as _arch
from . import expr as E
from .arch import ArchSpec

# ----------------------------------------------------------------------------------- constants
DEFAULT_SYMBOL_VALUE = 4096   # value of a scalar param missing from `shapes` (clamped to its min/max)
ISSUE_SLOTS_PER_CLOCK = 4     # warp schedulers per SM (sm_80 .. sm_90): warp instructions per clock
LDMATRIX_X4_BYTES = 512       # one ldmatrix.x4: four 8x8 16-bit matrices per warp
MAX_GUARD_SAMPLES = 256       # loop iterations sampled when a guard depends on loop variables
TERMS = ("compute", "memory", "issue", "latency")

CALIBRATION_DIR = Path(__file__).resolve().parent.parent / "calibration" / "data"
# GPU product names -> the arch-table entry their calibration files override.
GPU_ARCH = {
    "h100": "sm_90a", "h200": "sm_90a", "h800": "sm_90a", "gh200": "sm_90a", "h20": "sm_90a",
    "a100": "sm_80", "a800": "sm_80", "a30": "sm_80",
    "a10": "sm_86", "a40": "sm_86", "a6000": "sm_86", "rtx3090": "sm_86", "rtx3080": "sm_86",
    "l4": "sm_89", "l40": "sm_89", "l40s": "sm_89", "rtx4090": "sm_89", "rtx6000ada": "sm_89",
}

# Value-expression functions: (SFU ops, extra SIMT ops) per element.
_SFU_FUNCS = {"exp": (1, 1), "exp2": (1, 0), "log": (1, 1), "log2": (1, 0), "sqrt": (1, 0), "rsqrt": (1, 0),
              "tanh": (1, 0), "recip": (1, 0), "sigmoid": (2, 2), "softplus": (2, 2)}
_SIMT_FUNCS = {"abs", "max", "min", "select", "floor"}
_THREAD_BUILTINS = {"tid", "lane", "warp", "role_warp", "role_tid", "wg", "wg_tid"}


# -------------------------------------------------------------------------------- constants I/O
def load_constants(gpu_name_or_path: Union[str, Path], arch: Optional[str] = None) -> ArchSpec:
    """The arch table's spec with calibrated overrides applied.

    `gpu_name_or_path` is a path to a calibration JSON file, a GPU name (`h200` reads
    `calibration/data/h200.json`) or an arch name (`sm_90a`: the table's defaults). The file is a JSON
    object of ArchSpec field overrides plus `"arch"` (which table entry it overrides), `"version"` and
    optional `"gpu"`, `"measured"`, `"notes"`, `"provenance"` (not constants).
    Without a file, the table's defaults for `arch` (or the GPU name's known arch) come back.
    Unknown fields in a file raise ValueError (a calibration bug must be loud)."""
    text = str(gpu_name_or_path)
    if text in _arch.ARCH_TABLE and arch is None and not Path(text).is_file():
        return _arch.spec(text)
    p = Path(text)
    if not p.is_file():
        p = CALIBRATION_DIR / f"{text.lower()}.json"
    if p.is_file():
        data = json.loads(p.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{p}: calibration data must be a JSON object")
        base = arch or data.get("arch") or GPU_ARCH.get(p.stem.lower())
        if base not in _arch.ARCH_TABLE:
            raise ValueError(f"{p}: unknown or missing \"arch\" ({base!r}); one of {', '.join(_arch.ARCHES)}")
        known = {f.name for f in fields(ArchSpec)}
        # "provenance": where a promoted version came from (knowledge/promote/calibration.py)
        over = {k: v for k, v in data.items() if k not in ("arch", "version", "gpu", "measured", "notes", "provenance")}
        bad = sorted(k for k in over if k not in known or k in ("name", "features"))
        if bad:
            raise ValueError(f"{p}: not overridable ArchSpec fields: {', '.join(bad)}")
        return _arch.with_overrides(base, **over)
    base = arch or GPU_ARCH.get(text.lower())
    if base in _arch.ARCH_TABLE:
        return _arch.spec(base)
    raise ValueError(f"no calibration file for {text!r} and no known arch for it "
                     f"(pass arch=, or one of {', '.join(_arch.ARCHES)})")


# ------------------------------------------------------------------------------------ roofline
def _tensor_rate(spec: ArchSpec, unit: str) -> float:
    if unit == "wgmma" and spec.wgmma_flops > 0:
        return spec.wgmma_flops
    if unit == "fp32":
        return spec.fp32_flops
    return spec.mma_sync_flops


def roofline_floor(flops: float, bytes: float, spec: ArchSpec, unit: str = "auto") -> float:
    """Lower bound on seconds: max(flops / peak rate, bytes / HBM bandwidth).

    unit: "wgmma", "mma_sync", "fp32", or "auto" (wgmma where the arch has it, else mma_sync)."""
    if unit == "auto":
        unit = "wgmma" if spec.wgmma_flops > 0 else "mma_sync"
    rate = _tensor_rate(spec, unit)
    return max(flops / rate if rate > 0 else 0.0, bytes / spec.hbm_bw if spec.hbm_bw > 0 else 0.0)


def ridge_point(spec: ArchSpec, unit: str = "auto") -> float:
    """Arithmetic intensity (FLOP/byte) above which a kernel is compute bound on the roofline."""
    if unit == "auto":
        unit = "wgmma" if spec.wgmma_flops > 0 else "mma_sync"
    return _tensor_rate(spec, unit) / spec.hbm_bw


# -------------------------------------------------------------------------------------- report
@dataclass
class NodeCost:
    """One statement's cost. Counts are for the whole launch (all CTAs)."""

    path: str
    kind: str                      # op, or op.kind for copies ("copy.tma_load")
    count: float = 0.0             # executions per CTA (scope groups x loop trips)
    mechanism: Optional[str] = None  # tma / bulk / cp_async / ldg / stg / sync for global traffic
    tensor: Optional[str] = None   # global tensor it reads or writes
    bytes: float = 0.0             # global bytes
    smem_bytes: float = 0.0
    flops: float = 0.0             # tensor-core + SIMT FLOPs
    sfu_ops: float = 0.0
    warp_instrs: float = 0.0
    terms: dict = field(default_factory=dict)  # term -> seconds of that term attributed to this node
    seconds: float = 0.0           # largest of `terms`
    bound: str = ""                # the term of that largest share


@dataclass
class LatencyStream:
    path: str                      # first load of the stream
    role: Optional[str]
    loop: Optional[str]            # innermost loop path (None: straight-line)
    mechanism: str
    stages: int
    iterations: float              # per CTA
    latency_s: float
    exposed_s: float               # per CTA, added to the CTA's time (fill or serial)
    steady_s: float                # per CTA, a throughput bound for pipelined streams
    pipeline: Optional[str] = None


@dataclass
class CostReport:
    kernel: str
    arch: str
    spec: str                              # the ArchSpec name used
    seconds: float = 0.0
    bound: str = "latency"
    binding_path: Optional[str] = None
    terms: dict = field(default_factory=lambda: {t: 0.0 for t in TERMS})
    term_paths: dict = field(default_factory=lambda: {t: None for t in TERMS})
    nodes: list = field(default_factory=list)
    shapes: dict = field(default_factory=dict)   # symbol values used
    grid: list = field(default_factory=list)
    blocks: int = 1
    threads: int = 0
    smem_bytes: int = 0
    regs_per_thread: float = 0.0
    blocks_per_sm: int = 1
    occupancy_limit: str = ""
    waves: int = 1
    resident_ctas: int = 1
    per_cta: dict = field(default_factory=dict)       # bytes by mechanism, flops, sfu, smem, instrs
    totals: dict = field(default_factory=dict)        # whole launch
    dram_bytes: float = 0.0
    latency: list = field(default_factory=list)       # LatencyStream
    launch_overhead_s: float = 0.0
    roofline_s: float = 0.0
    assumptions: list = field(default_factory=list)
    kernels: list = field(default_factory=list)       # a Program's per-kernel CostReports, in launch order

    @property
    def efficiency(self) -> float:
        """Roofline floor / predicted time (1.0 = at the roofline)."""
        return self.roofline_s / self.seconds if self.seconds > 0 else 0.0

    def node(self, path: str) -> Optional[NodeCost]:
        return next((n for n in self.nodes if n.path == path), None)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["efficiency"] = self.efficiency
        return d

    def summary(self) -> str:
        lines = [f"kernel {self.kernel} ({self.arch}, constants {self.spec}): predicted {_fmt_s(self.seconds)}, "
                 f"bound by {self.bound} at {self.binding_path or '/'}",
                 f"  grid {self.grid} = {self.blocks} CTAs x {self.threads} threads; {self.blocks_per_sm} CTA/SM "
                 f"(limit: {self.occupancy_limit}; smem {self.smem_bytes} B, ~{self.regs_per_thread:.0f} regs/thread); "
                 f"{self.waves} wave(s)",
                 f"  roofline floor {_fmt_s(self.roofline_s)} ({100 * self.efficiency:.0f}% of predicted)"]
        for t in TERMS:
            lines.append(f"  {t:<8} {_fmt_s(self.terms[t]):>10}  at {self.term_paths.get(t) or '-'}")
        pc = self.per_cta
        by = ", ".join(f"{m} {_fmt_b(b)}" for m, b in sorted(pc.get("bytes_by_mechanism", {}).items()))
        lines.append(f"  per CTA: global {by or '0 B'}; tensor {pc.get('tensor_flops', 0):.3g} FLOP; "
                     f"simt {pc.get('simt_ops', 0):.3g} op; sfu {pc.get('sfu_ops', 0):.3g}; "
                     f"smem {_fmt_b(pc.get('smem_bytes', 0))}; {pc.get('warp_instrs', 0):.3g} warp instrs")
        lines.append(f"  total: {_fmt_b(self.totals.get('bytes', 0))} global ({_fmt_b(self.dram_bytes)} HBM), "
                     f"{self.totals.get('flops', 0):.3g} FLOP")
        for s in self.latency:
            lines.append(f"  latency stream {s.path}: {s.mechanism} x{s.stages} stage(s), {s.iterations:.0f} iter/CTA, "
                         f"exposed {_fmt_s(s.exposed_s)}, steady {_fmt_s(s.steady_s)}")
        top = sorted(self.nodes, key=lambda n: -n.seconds)[:8]
        if top:
            lines.append("  top nodes:")
            for n in top:
                lines.append(f"    {n.path:<36} {n.kind:<16} {_fmt_s(n.seconds):>10} {n.bound}")
        if self.assumptions:
            lines.append("  assumptions:")
            lines.extend(f"    - {a}" for a in self.assumptions)
        for i, k in enumerate(self.kernels):
            lines.append(f"  /kernels/{i} {k.kernel}: {_fmt_s(k.seconds)}, bound by {k.bound} at "
                         f"{k.binding_path or '/'}; grid {k.grid} x {k.threads} threads, smem {k.smem_bytes} B")
        return "\n".join(lines)


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.2f} us"


def _fmt_b(b: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


# ------------------------------------------------------------------------- fast expression eval
class _Unknown(Exception):
    pass


def _floordiv(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    return a / b


def _cdiv(a, b):
    return -(-a // b)


_EVAL_GLOBALS = {"_div": _floordiv, "_mod": lambda a, b: a % b, "_min": min, "_max": max, "_cdiv": _cdiv,
                 "__builtins__": {}}


def _py(n) -> str:
    if isinstance(n, E.Num):
        return repr(n.value)
    if isinstance(n, E.Var):
        return f"_v[{n.name!r}]"
    if isinstance(n, E.Un):
        return f"(-{_py(n.a)})" if n.op == "-" else f"(not {_py(n.a)})"
    if isinstance(n, E.Bin):
        a, b = _py(n.a), _py(n.b)
        if n.op == "/":
            return f"_div({a}, {b})"
        if n.op == "%":
            return f"_mod({a}, {b})"
        if n.op == "&&":
            return f"({a} and {b})"
        if n.op == "||":
            return f"({a} or {b})"
        return f"({a} {n.op} {b})"
    if isinstance(n, E.Call):
        if n.fn == "elect_one":
            return "(_v['lane'] == 0)"
        if n.fn == "ld":   # a run-time read: its estimate (default: its lower bound) stands in for it
            return _py(E.ld_estimate(n))
        return f"_{n.fn}({', '.join(_py(x) for x in n.args)})"
    raise _Unknown(f"cannot evaluate {n!r}")


class _Evaluator:
    """Compiles index/condition strings once to Python lambdas (fast enough to run per thread)."""

    def __init__(self):
        self._cache: dict = {}

    def fn(self, text, cond: bool = False):
        key = (text, cond)
        if key not in self._cache:
            try:
                node = E.parse_cond(text) if cond else E.parse_index(text)
                self._cache[key] = (eval("lambda _v: " + _py(node), _EVAL_GLOBALS), E.free_vars(node))  # noqa: S307
            except (E.ExprError, _Unknown, SyntaxError, RecursionError, MemoryError) as e:
                self._cache[key] = (None, str(e))
        return self._cache[key]

    def value(self, text, env: Mapping, cond: bool = False):
        f, _ = self.fn(text, cond)
        if f is None:
            raise _Unknown(f"unparsable {text!r}")
        try:
            return f(env)
        except KeyError as e:
            raise _Unknown(f"unbound {e.args[0]!r} in {text!r}") from None
        except (ZeroDivisionError, TypeError, ValueError, OverflowError, RecursionError) as e:
            raise _Unknown(f"{type(e).__name__} evaluating {text!r}") from None

    def free(self, text, cond: bool = False) -> set:
        f, fv = self.fn(text, cond)
        return set(fv) if f is not None else set()


# ------------------------------------------------------------------------------- the model
@dataclass
class _Exec:
    """How often a statement runs per CTA: loop trips x the scope groups whose guard passes."""

    mult: float            # product of enclosing trip counts
    threads: float         # average passing threads per iteration
    warps: float
    wgs: float
    any: float             # fraction of iterations where some thread passes
    all_pass: bool         # every role thread passes (no thread-selecting guard)
    inner_trips: int = 1   # trip count of the innermost enclosing loop
    env: dict = field(default_factory=dict)  # representative values (outer loops at their middle)


@dataclass
class _Raw:
    """Per-CTA quantities of one node before they are turned into seconds."""

    path: str
    kind: str
    role: Optional[int]
    count: float = 0.0
    mechanism: Optional[str] = None
    tensor: Optional[str] = None
    gbytes: float = 0.0
    smem_bytes: float = 0.0
    flops_wgmma: float = 0.0
    flops_mma: float = 0.0
    simt_ops: float = 0.0
    sfu_ops: float = 0.0
    warp_instrs: float = 0.0
    execs_per_warp: float = 0.0     # mean executions per warp of its role (SASS-based counts)
    # a loop inside the node runs a data-dependent number of times (the f32 shared-memory atomic's
    # compare-and-swap retries): its static SASS undercounts it, so SASS-based counts keep the model's
    retries: bool = False


class _Model:
    def __init__(self, kernel, shapes: Optional[Mapping[str, int]], spec: ArchSpec):
        self.k = kernel
        self.spec = spec
        self.ev = _Evaluator()
        self.sass: Optional[dict] = None      # IR node path -> static SASS instructions (estimate(sass=))
        self.ptxas_regs: Optional[int] = None  # registers per thread of the compiled kernel (estimate(compiled=))
        self.assumptions: list[str] = []
        self._seen_assumptions: set[str] = set()
        self.shapes_used: dict[str, Any] = {}
        self.values = self._symbol_values(dict(shapes or {}))

    # ---- assumptions
    def assume(self, text: str) -> None:
        if text not in self._seen_assumptions:
            self._seen_assumptions.add(text)
            self.assumptions.append(text)

    # ---- symbols
    def _symbol_values(self, shapes: dict) -> dict:
        from .nodes import ScalarParam

        vals: dict[str, Any] = dict(self.k.consts)
        for name in shapes:
            if name in self.k.consts:
                self.assume(f"shape {name}={shapes[name]} ignored: {name} is a compile-time const ({self.k.consts[name]})")
        names = set()
        for p in self.k.params:
            if not isinstance(p, ScalarParam):
                continue
            names.add(p.name)
            if p.dtype == "f32":
                vals[p.name] = float(shapes.get(p.name, 1.0))
                continue
            if p.name in shapes:
                v = int(shapes[p.name])
                if (p.min is not None and v < p.min) or (p.max is not None and v > p.max) or v % p.divisible_by:
                    self.assume(f"{p.name}={v} violates the param's facts (min {p.min}, max {p.max}, "
                                f"divisible_by {p.divisible_by}); used as given")
            else:
                v = DEFAULT_SYMBOL_VALUE
                if p.min is not None:
                    v = max(v, p.min)
                if p.max is not None:
                    v = min(v, p.max)
                if p.divisible_by > 1:
                    v = max(p.divisible_by, -(-v // p.divisible_by) * p.divisible_by)
                    if p.max is not None and v > p.max:
                        v -= p.divisible_by
                self.assume(f"{p.name} not given: assumed {v} (default {DEFAULT_SYMBOL_VALUE} clamped to the "
                            f"param's min/max/divisible_by)")
            vals[p.name] = v
            self.shapes_used[p.name] = v
        for name, v in shapes.items():
            if name not in names and name not in self.k.consts:
                vals[name] = v
                self.shapes_used[name] = v
                self.assume(f"shape {name}={v} is not a scalar param; bound as a free symbol")
        return vals

    def eval_int(self, text, env, what: str, default: int) -> int:
        try:
            v = self.ev.value(text, env)
            return int(v)
        except (_Unknown, TypeError, ValueError, OverflowError) as e:
            self.assume(f"{what}: could not evaluate {text!r} ({e}); assumed {default}")
            return default

    # ---- launch shape
    def grid(self) -> list[int]:
        dims = []
        for i, g in enumerate(self.k.launch.grid):
            dims.append(max(1, self.eval_int(g, self.values, f"/launch/grid/{i}", 1)))
        return dims

    # ---- per-thread environments
    def base_env(self, grid: list[int]) -> dict:
        env = dict(self.values)
        for axis, g in zip("xyz", grid + [1] * (3 - len(grid))):
            env[f"nbid.{axis}"] = g
            env[f"bid.{axis}"] = (g - 1) // 2   # a representative CTA in the middle of the grid
        return env

    @staticmethod
    def thread_vars(env: dict, first_warp: int, r: int) -> None:
        tid = 32 * first_warp + r
        env["tid"] = tid
        env["lane"] = tid % 32
        env["warp"] = tid // 32
        env["role_warp"] = r // 32
        env["role_tid"] = r
        env["wg"] = r // 128
        env["wg_tid"] = r % 128

    def apply_lets(self, env: dict, lets) -> None:
        for let in lets:
            try:
                env[let.name] = self.ev.value(let.value, env)
            except _Unknown:
                pass

    # ---- statement executions
    def loops_info(self, site, env: dict, role_threads: int = 0, first_warp: int = 0) -> tuple[list, dict]:
        """Trip counts and sample values of the enclosing loops, outer loops at their middle value. A
        loop whose bounds depend on the thread (a producer warp taking every P-th chunk from its warp
        index) gets the mean trip count over the role's warps, and warp 0's values."""
        env = dict(env)
        info = []
        self.apply_lets(env, site.lets)
        for loop, lpath in zip(site.loops, site.loop_paths):
            try:
                try:
                    start, trips = self._trips(loop, env)
                except _Unknown:
                    if role_threads <= 0:
                        raise
                    per_warp = []
                    for w in range(math.ceil(role_threads / 32)):
                        e = dict(env)
                        self.thread_vars(e, first_warp, 32 * w)
                        self.apply_lets(e, site.lets)
                        per_warp.append(self._trips(loop, e))
                    start = per_warp[0][0]
                    trips = sum(t for _, t in per_warp) / len(per_warp)
            except (_Unknown, TypeError, ValueError, OverflowError) as e:
                self.assume(f"{lpath}: trip count of loop {loop.var} not evaluable ({e}); assumed 1")
                start, trips = 0, 1
            values = [start + loop.step * j for j in _sample_indices(math.ceil(trips), MAX_GUARD_SAMPLES)]
            env[loop.var] = values[len(values) // 2] if values else start
            info.append((loop, trips, values))
            self.apply_lets(env, site.lets)
        return info, env

    def _trips(self, loop, env: dict) -> tuple[int, int]:
        start = int(self.ev.value(loop.start, env))
        stop = int(self.ev.value(loop.stop, env))
        return start, max(0, -(-(stop - start) // loop.step))

    def executions(self, site, grid_env: dict, role_threads: int, first_warp: int) -> _Exec:
        info, env = self.loops_info(site, grid_env, role_threads, first_warp)
        mult = 1.0
        for _, trips, _ in info:
            mult *= trips
        inner = info[-1][1] if info else 1
        if not site.guards:
            return _Exec(mult, role_threads, math.ceil(role_threads / 32), math.ceil(role_threads / 128), 1.0, True,
                         inner, env)
        # Which variables the guards depend on (through lets too).
        refs: set = set()
        for g in site.guards:
            refs |= self.ev.free(g.cond, cond=True) if not isinstance(g.cond, bool) else set()
            if isinstance(g.cond, str) and "elect_one" in g.cond:
                refs.add("lane")
        let_vals = {let.name: let.value for let in site.lets}
        frontier = list(refs)
        while frontier:
            n = frontier.pop()
            if n in let_vals:
                for m in self.ev.free(let_vals[n]):
                    if m not in refs:
                        refs.add(m)
                        frontier.append(m)
        by_thread = bool(refs & _THREAD_BUILTINS)
        loop_dims = [(loop.var, values) for loop, _, values in info if loop.var in refs and values]
        budget = 64 if by_thread else MAX_GUARD_SAMPLES
        if loop_dims:
            per = max(2, int(budget ** (1 / len(loop_dims))))
            loop_dims = [(v, [vals[i] for i in _sample_indices(len(vals), per)]) for v, vals in loop_dims]
        samples = [{}]
        for var, vals in loop_dims:
            samples = [dict(s, **{var: x}) for s in samples for x in vals]
        thread_ids = range(role_threads) if by_thread else (0,)
        guard_lets = [let for let in site.lets if let.name in refs]   # refs is closed over lets: the rest cannot matter
        tot_t = tot_w = tot_g = tot_any = 0.0
        all_pass = True
        failed = False
        for s in samples:
            passing = []
            for r in thread_ids:
                e = dict(env)
                e.update(s)
                self.thread_vars(e, first_warp, r)
                self.apply_lets(e, guard_lets)
                ok = True
                for g in site.guards:
                    try:
                        c = bool(self.ev.value(g.cond, e, cond=True)) if not isinstance(g.cond, bool) else g.cond
                    except _Unknown as err:
                        if not failed:
                            self.assume(f"{g.path}: condition not evaluable ({err}); assumed true")
                        failed = True
                        c = g.taken
                    if c != g.taken:
                        ok = False
                        break
                if ok:
                    passing.append(r)
            if not by_thread:
                passing = list(range(role_threads)) if passing else []
            if len(passing) != role_threads:
                all_pass = False
            tot_t += len(passing)
            tot_w += len({r // 32 for r in passing})
            tot_g += len({r // 128 for r in passing})
            tot_any += 1.0 if passing else 0.0
        n = len(samples)
        return _Exec(mult, tot_t / n, tot_w / n, tot_g / n, tot_any / n, all_pass, inner, env)

    # ---- groups of a scope
    @staticmethod
    def groups(ex: _Exec, scope: str) -> float:
        if scope == "thread":
            return ex.threads
        if scope == "warp":
            return ex.warps
        if scope == "warpgroup":
            return ex.wgs
        return ex.any  # role / cta: the tile once per execution

    @staticmethod
    def scope_threads(scope: str, role_threads: int, cta_threads: int) -> int:
        return {"thread": 1, "warp": 32, "warpgroup": 128, "role": role_threads, "cta": cta_threads}.get(scope, 1)

    @staticmethod
    def reg_scope(buf) -> str:
        if buf is None:
            return "thread"
        if buf.layout in ("mma_a", "mma_b", "mma_acc"):
            return "warp"
        if buf.layout == "wgmma_acc":
            return "warpgroup"
        return buf.scope


def _sample_indices(n: int, limit: int) -> list[int]:
    """Up to `limit` evenly spaced indices of range(n), always the first and the last."""
    if n <= 0:
        return []
    if n <= limit:
        return list(range(n))
    return sorted({round(i * (n - 1) / (limit - 1)) for i in range(limit)})


def _value_ops(expr_text) -> tuple[int, int]:
    """(SIMT ops, SFU ops) per element of a map value expression."""
    try:
        node = E.parse_value(expr_text)
    except E.ExprError:
        return 1, 0
    simt = sfu = 0
    for n in E.walk(node):
        if isinstance(n, (E.Bin, E.Un)):
            simt += 1
        elif isinstance(n, E.Call):
            if n.fn in _SFU_FUNCS:
                s, o = _SFU_FUNCS[n.fn]
                sfu += s
                simt += o
            elif n.fn in _SIMT_FUNCS:
                simt += 1
    return max(simt, 1 if sfu == 0 else 0), sfu


# ----------------------------------------------------------------------------------- estimate
def estimate(kernel, shapes: Optional[Mapping[str, int]] = None,
             constants: Optional[ArchSpec] = None, sass: Optional[Mapping[str, int]] = None,
             compiled=None) -> CostReport:
    """Predict one launch of `kernel`; see the module docstring for the model. `sass` (IR node path ->
    static SASS instructions, `cake_ir.analysis.sass`) replaces the modelled instruction counts of the
    issue and serial terms by the compiled code's, times each node's executions per warp. `compiled`
    (the kernel's `compile_kernel` result) replaces the register estimate by ptxas's count.
    A Program is estimated with `estimate_program` (sass paths then start with /kernels/{i})."""
    from .nodes import Program
    if isinstance(kernel, Program):
        return estimate_program(kernel, shapes, constants, sass, compiled)
    spec = constants if constants is not None else _arch.spec(kernel.arch)
    spec, fixed = _sane(spec, kernel.arch)
    m = _Model(kernel, shapes, spec)
    m.sass = dict(sass) if sass else None
    m.ptxas_regs = (getattr(compiled, "resources", None) or {}).get("registers")
    for f in fixed:
        m.assume(f"constant {f} is not positive; the arch table's value is used")
    rep = CostReport(kernel=kernel.name, arch=kernel.arch, spec=spec.name)
    if spec.name != kernel.arch:
        m.assume(f"constants are for {spec.name} but the kernel targets {kernel.arch}")
    try:
        _estimate(m, rep)
    except Exception as e:  # noqa: BLE001 - the model must not take the caller down
        m.assume(f"cost model internal error: {type(e).__name__}: {e}")
    rep.assumptions = m.assumptions
    rep.shapes = m.shapes_used
    return rep


def estimate_program(program, shapes: Optional[Mapping[str, int]] = None,
                     constants: Optional[ArchSpec] = None, sass: Optional[Mapping[str, int]] = None,
                     compiled=None) -> CostReport:
    """One run of a Program: its kernels one after another (stream order, no overlap), so times,
    terms and bytes add up; shared memory is the largest kernel's (they never co-reside)."""
    from dataclasses import replace

    from .walk import program_path

    reps = []
    for i, k in enumerate(program.kernels):
        pre = f"/kernels/{i}"
        ksass = {p[len(pre):]: n for p, n in sass.items() if p.startswith(pre + "/")} if sass else None
        kc = compiled.kernels[i] if compiled is not None and i < len(getattr(compiled, "kernels", [])) else None
        reps.append(estimate(k, shapes, constants, ksass or None, kc))
    slow = max(range(len(reps)), key=lambda i: reps[i].seconds)
    top = reps[slow]

    at = program_path
    rep = CostReport(kernel=program.name, arch=program.arch, spec=top.spec, kernels=reps)
    rep.seconds = sum(r.seconds for r in reps)
    rep.terms = {t: sum(r.terms.get(t, 0.0) for r in reps) for t in TERMS}
    for t in TERMS:   # the node of the kernel that contributes most to the term
        i = max(range(len(reps)), key=lambda j: reps[j].terms.get(t, 0.0))
        rep.term_paths[t] = at(i, reps[i].term_paths.get(t))
    rep.bound = max(TERMS, key=lambda t: rep.terms[t])
    rep.binding_path = at(slow, top.binding_path)
    rep.nodes = [replace(n, path=at(i, n.path)) for i, r in enumerate(reps) for n in r.nodes]
    rep.latency = [replace(s, path=at(i, s.path), loop=at(i, s.loop)) for i, r in enumerate(reps) for s in r.latency]
    rep.shapes = {k: v for r in reps for k, v in r.shapes.items()}
    rep.grid, rep.blocks, rep.threads = top.grid, top.blocks, top.threads
    rep.regs_per_thread, rep.blocks_per_sm, rep.occupancy_limit = top.regs_per_thread, top.blocks_per_sm, top.occupancy_limit
    rep.waves, rep.resident_ctas, rep.per_cta = top.waves, top.resident_ctas, top.per_cta
    rep.smem_bytes = max(r.smem_bytes for r in reps)
    rep.totals = {}
    for r in reps:
        for k, v in r.totals.items():
            if isinstance(v, (int, float)):
                rep.totals[k] = rep.totals.get(k, 0) + v
    for name in ("dram_bytes", "launch_overhead_s", "roofline_s"):
        setattr(rep, name, sum(getattr(r, name) for r in reps))
    rep.assumptions = [f"{program.kernels[i].name}: {a}" for i, r in enumerate(reps) for a in r.assumptions]
    rep.assumptions.insert(0, f"{len(reps)} kernels in stream order; launch shape, occupancy and per-CTA counts "
                              f"above are the slowest kernel's ({top.kernel})")
    return rep


_POSITIVE = ("sms", "max_threads_per_sm", "max_blocks_per_sm", "smem_per_sm", "regs_per_sm", "hbm_bw", "l2_bw",
             "smem_bw_per_sm", "mma_sync_flops", "fp32_flops", "sfu_ops", "clock_hz")


def _sane(spec: ArchSpec, arch: str) -> tuple[ArchSpec, list[str]]:
    """Replace non-positive rates/limits (a broken calibration file) by the arch table's values."""
    from dataclasses import replace

    table = _arch.ARCH_TABLE.get(spec.name) or _arch.ARCH_TABLE.get(arch) or _arch.ARCH_TABLE["sm_90a"]
    bad = [f for f in _POSITIVE if not (getattr(spec, f) > 0)]
    if not bad:
        return spec, []
    return replace(spec, **{f: getattr(table, f) for f in bad}), bad


def topk_merge_instrs(k: int) -> int:
    """Instructions per thread to merge two sorted lists of k by the bitonic network
    (cake::topk_merge_sorted): P = k rounded up to a power of two; P pair selections (a compare, two
    selects) and P / 2 log2 P compare-exchanges (a compare, four selects)."""
    p = 1 << max(0, (k - 1).bit_length())
    return 3 * p + 5 * (p // 2) * max(0, p.bit_length() - 1)


def topk_insertion_instrs(k: int, n: int, tiles: int, queue: int = 0) -> float:
    """Expected warp instructions per tile and row slot (8 rows x 4 lanes of a warp) that a filtered
    top-k over an accumulator spends inserting, averaged over a stream of `tiles` tiles with n scores
    per lane and row. A score passes the row's threshold with p_t ~ 1.5 k / (4 n t) at tile t (the
    threshold sits between the row's k-th and ~1.7k-th best of the 4 n t seen; uniform order); the warp
    runs an insertion (~6k + 4 instructions) at every column where any of its 32 lanes passes:
    1 - (1 - p_t)^32 of them. With a queue of T entries (the deferred insertion) such a column costs a
    push (2 T + 3) instead while the lanes pass fewer than T / 2 per tile, and the flushes insert about
    as often as the busiest lane passed (mean + 2.5 sd over the stream). Checked against ncu: k = 16
    over k = 8 on the same kernel ran 1.94x the instructions; the whole estimate 1.78x."""
    if k <= 1 or n <= 0 or tiles <= 0:
        return 0.0
    c_ins, c_push = 6.0 * k + 4.0, 2.0 * queue + 3.0
    total, lam_sum = 0.0, 0.0
    t, ts = 1.0, []
    while t <= tiles:                     # tiles 1..16 one by one, then geometric buckets
        w = 1.0 if t < 16 else max(1.0, min(tiles + 1.0 - t, t * 0.25))
        ts.append((t + (w - 1) / 2, w))
        t += w
    for tm, w in ts:
        p = min(1.0, 1.5 * k / (4.0 * n * tm))
        cols = n * (1.0 - (1.0 - p) ** 32)  # columns where some lane passes
        lam = n * p                         # a lane's passes in the tile
        if queue and lam < queue / 2:
            total += w * (cols * c_push + 3.0)   # + the vote
            lam_sum += w * lam
        else:
            total += w * cols * c_ins
    total += (lam_sum + 2.5 * math.sqrt(lam_sum)) * c_ins
    return total / tiles


def _sort_op_cost(m: _Model, st, ex: _Exec, per_iter: float, raw: _Raw, resolve_tile) -> None:
    """A counting-sort op's traffic per CTA execution, its `count` taken at the representative CTA:
    segment_sums reads a src row (2 D bytes) and a slot's id and key per slot, ~1.5 instructions per loaded
    half-pair a thread; bucket_place reads a key, does an atomic on its cursor and writes two words per element."""
    try:
        n = float(m.ev.value(st.count, dict(ex.env)))
    except (_Unknown, TypeError, ValueError, OverflowError):
        n = 0.0
        m.assume(f"{raw.path}: {st.op} count unevaluable; counted as 0")
    g = ex.any * per_iter
    raw.count = g
    if st.op == "segment_sums":
        src = resolve_tile(m.k, st.src)
        d = src.shape[-1] if src.shape else 0
        raw.gbytes = (2.0 * d + 8.0) * n * g
        raw.mechanism = "ldg"
        raw.tensor = st.src.buf
        raw.warp_instrs += 6.0 * d / 8 * n / 32 * g
    else:
        raw.gbytes = 16.0 * n * g
        raw.mechanism = "atomic"
        raw.tensor = st.cursor.buf
        raw.warp_instrs += 8.0 * n / 32 * g


def _estimate(m: _Model, rep: CostReport) -> None:
    from .analysis.tiles import bulk_rows, resolve_tile, threads_in_scope
    from .dtypes import SIZE
    from .nodes import (Access, BucketPlace, Copy, Fill, For, If, LastCta, Let, Map, MmaSync, OneHot, RedAdd, Reduce,
                        Scan, ScatterAdd, SegmentSums, TopK, TopKBound, TopKMerge, Wgmma)
    from .walk import statements

    k, spec = m.k, m.spec
    grid = m.grid()
    rep.grid = grid
    rep.blocks = blocks = math.prod(grid)
    rep.threads = cta_threads = k.launch.threads
    genv = m.base_env(grid)
    if k.launch.cluster and math.prod(k.launch.cluster) > 1:
        m.assume("clusters: a multicast copy counts the bytes its CTA reads (its share of the tile), the "
                 "co-scheduling of a cluster's CTAs is not modelled")

    def nbytes(dtype: str) -> int:
        return SIZE.get(dtype, 4)

    raws: list[_Raw] = []
    exec_cache: dict = {}
    load_sites: list = []   # (site, raw, ex)

    for site in statements(k):
        st = site.node
        op = getattr(st, "op", "?")
        role = site.role
        role_threads = role.threads if role is not None else cta_threads
        first_warp = role.first_warp if role is not None else 0
        key = (site.role_index, site.loop_paths, tuple((g.path, g.taken) for g in site.guards), len(site.lets))
        if key not in exec_cache:
            exec_cache[key] = m.executions(site, genv, role_threads, first_warp)
        ex = exec_cache[key]
        per_iter = ex.mult
        raw = _Raw(site.path, op if op != "copy" else f"copy.{st.kind}", site.role_index)
        warps_exec = ex.warps * per_iter
        raw.execs_per_warp = warps_exec / max(1, math.ceil(role_threads / 32))

        def scope_work(scope: str, thread_instrs_per_group: float) -> float:
            """Executions of the statement by `scope` groups; adds warp instructions."""
            g = m.groups(ex, scope) * per_iter
            if scope == "thread":
                raw.warp_instrs += thread_instrs_per_group * warps_exec
            else:
                raw.warp_instrs += thread_instrs_per_group / 32 * g
            return g

        try:
            if isinstance(st, Copy):
                src, dst = resolve_tile(k, st.src), resolve_tile(k, st.dst)
                gtile = src if src.space == "global" else dst
                other = dst if gtile is src else src
                elems = other.elems or gtile.elems
                if not elems:
                    m.assume(f"{site.path}: tile shape unknown; counted as 0 bytes")
                gsize = nbytes(gtile.dtype) if gtile.known else nbytes(other.dtype)
                tile_bytes = elems * gsize
                raw.tensor = gtile.ref.buf if gtile.space == "global" else None
                if st.kind in ("tma_load", "tma_store"):
                    # The lowering issues a TMA copy from every thread that executes it; a verified
                    # kernel elects one. Unguarded, it is counted once (what the author meant).
                    if ex.all_pass:
                        n = ex.any * per_iter
                        if role_threads > 1:
                            m.assume(f"{site.path}: {st.kind} not under a thread-electing guard; counted once")
                    else:
                        n = ex.threads * per_iter
                    raw.count = n
                    raw.gbytes = tile_bytes * n
                    raw.mechanism = "tma"
                    raw.warp_instrs += 2 * n
                elif st.kind == "bulk_load":
                    # one cp.async.bulk per tile row (or one for a tile whose rows are one run:
                    # tiles.bulk_rows), dealt round-robin to the scope's threads: a warp issues
                    # ceil(copies / scope threads) rounds of (address + copy); the bulk-copy engine writes
                    # shared memory (no LSU traffic, as for TMA)
                    plan = bulk_rows(k, st.src, st.dst)
                    copies = plan.copies if plan else elems / max(1, (other.shape or gtile.shape or (1,))[-1])
                    T = threads_in_scope(st.scope, role_threads, cta_threads)
                    g = scope_work(st.scope, math.ceil(copies / T) * 2.0 * T)
                    raw.count = g
                    raw.gbytes = (plan.total_bytes if plan else tile_bytes) * g
                    raw.mechanism = "bulk"
                else:
                    chunks = tile_bytes / st.vec_bytes
                    per = 2.0 if st.kind == "cp_async" else 3.0   # address + copy (+ the st.shared for sync)
                    g = scope_work(st.scope, chunks * per)
                    raw.count = g
                    raw.gbytes = tile_bytes * g
                    raw.smem_bytes = elems * nbytes(other.dtype) * g
                    raw.mechanism = "cp_async" if st.kind == "cp_async" else "sync"
                if st.kind in ("tma_load", "bulk_load", "cp_async", "sync"):
                    load_sites.append((site, raw, ex))
            elif isinstance(st, Access):
                src, dst = resolve_tile(k, st.src), resolve_tile(k, st.dst)
                if st.op == "ldmatrix":
                    frag = dst
                    b = frag.bytes or src.bytes
                    g = m.groups(ex, "warp") * per_iter
                    raw.count = g
                    raw.smem_bytes = b * g
                    raw.warp_instrs += max(1.0, b / LDMATRIX_X4_BYTES) * g
                else:
                    reg = dst if st.op in ("ldg", "lds") else src
                    mem = src if st.op in ("ldg", "lds") else dst
                    elems = reg.elems or mem.elems
                    if not elems:
                        m.assume(f"{site.path}: tile shape unknown; counted as 0 bytes")
                    b = elems * (nbytes(mem.dtype) if mem.known else nbytes(reg.dtype))
                    scope = m.reg_scope(reg.buffer)
                    g = scope_work(scope, b / st.vec_bytes)   # one vector access per vec_bytes
                    raw.count = g
                    if st.op in ("ldg", "stg"):
                        raw.gbytes = b * g
                        raw.mechanism = st.op
                        raw.tensor = mem.ref.buf if mem.space == "global" else None
                        if st.op == "ldg":
                            load_sites.append((site, raw, ex))
                    else:
                        raw.smem_bytes = b * g
            elif isinstance(st, MmaSync):
                a, c = resolve_tile(k, st.a), resolve_tile(k, st.c)
                im, in_, ik = st.shape
                tm = c.shape[0] if len(c.shape) >= 2 else im
                tn = c.shape[1] if len(c.shape) >= 2 else in_
                tk = a.shape[1] if len(a.shape) >= 2 else ik
                if len(c.shape) < 2 or len(a.shape) < 2:
                    m.assume(f"{site.path}: mma_sync tile shapes unknown; one instruction tile assumed")
                g = m.groups(ex, "warp") * per_iter
                raw.count = g
                raw.flops_mma = 2.0 * tm * tn * tk * g
                raw.warp_instrs += math.ceil(tm / im) * math.ceil(tn / in_) * math.ceil(tk / ik) * g
                if a.dtype not in ("bf16", "f16", "?"):
                    m.assume(f"{site.path}: mma_sync on {a.dtype} costed at the bf16 rate")
            elif isinstance(st, Wgmma):
                a = resolve_tile(k, st.a)
                wm, wn, wk = st.shape
                tk = a.shape[1] if len(a.shape) >= 2 else wk
                g = m.groups(ex, "warpgroup") * per_iter
                raw.count = g
                raw.flops_wgmma = 2.0 * wm * wn * tk * g
                raw.warp_instrs += 4 * math.ceil(tk / max(wk, 1)) * g
                if a.dtype not in ("bf16", "f16", "?"):
                    m.assume(f"{site.path}: wgmma on {a.dtype} costed at the bf16 rate")
            elif isinstance(st, (Map, Fill)):
                dst = resolve_tile(k, st.dst)
                simt, sfu = _value_ops(st.expr) if isinstance(st, Map) else (1, 0)
                scope = m.reg_scope(dst.buffer)
                g = scope_work(scope, dst.elems * (simt + sfu))
                raw.count = g
                raw.simt_ops = dst.elems * simt * g
                raw.sfu_ops = dst.elems * sfu * g
            elif isinstance(st, Reduce) and resolve_tile(k, st.src).space == "smem":
                # an smem tile reduced row per thread: the executing threads share the elements
                src = resolve_tile(k, st.src)
                g = scope_work(st.scope, 2 * src.elems)
                raw.count = g
                raw.simt_ops = 2 * src.elems * g
                raw.smem_bytes = src.bytes * g
            elif isinstance(st, (Reduce, Scan)):
                src = resolve_tile(k, st.src)
                scope = m.reg_scope(src.buffer)
                t = m.scope_threads(scope, role_threads, cta_threads)
                factor = 1 if isinstance(st, Reduce) else 2
                shuffle = 5 * max(1, min(t, 32))  # log2(32) shuffles per lane of each warp
                g = scope_work(scope, factor * src.elems + shuffle * math.ceil(t / 32))
                raw.count = g
                raw.simt_ops = factor * src.elems * g
            elif isinstance(st, TopK):
                # per score element: scale/bias FMAs + the threshold compare; over an accumulator tile
                # (k > 1) also the insertions the warp runs (topk_insertion_instrs: they bind at k >= 10)
                src = resolve_tile(k, st.src)
                scope = m.reg_scope(src.buffer)
                per = 3 + (1 if st.row_bias is not None else 0) + (1 if st.col_bias is not None else 0)
                inserts = 0.0
                if src.buffer is not None and src.buffer.layout in ("mma_acc", "wgmma_acc") and st.k > 1:
                    wg = src.buffer.layout == "wgmma_acc"
                    rows, cols = (16 if wg else src.buffer.shape[0]), src.buffer.shape[-1]
                    queue = resolve_tile(k, st.queue_idx).buffer.shape[-1] if st.queue_idx is not None else 0
                    slots = (4 if wg else 1) * rows // 8       # row slots (8 rows x 4 lanes) per scope group
                    inserts = 32 * slots * topk_insertion_instrs(st.k, cols // 4, max(1, ex.inner_trips), queue)
                if st.src_sorted:   # each row a sorted list of k: one bitonic merge per row
                    per, inserts = 0, (src.elems // max(1, st.k)) * topk_merge_instrs(st.k)
                g = scope_work(scope, src.elems * per + inserts)
                raw.count = g
                raw.simt_ops = src.elems * per * g
                if st.col_bias is not None or st.row_bias is not None:
                    raw.smem_bytes = 4 * src.elems * g
            elif isinstance(st, TopKMerge):
                vals = resolve_tile(k, st.vals)
                kk = vals.shape[-1] if vals.shape else 1
                rows = vals.shape[0] if vals.shape else 16
                # 2 xor steps: the partner's list by shuffles, then a bitonic merge (cake::topk_merge_quad)
                g = scope_work("warp", 32 * (rows // 8) * 2 * (2 * kk + topk_merge_instrs(kk)))
                raw.count = g
                raw.simt_ops = 32 * (rows // 8) * 2 * topk_merge_instrs(kk) * g
            elif isinstance(st, TopKBound):
                # a word per row slot: a global load (load) or a key conversion and store (store)
                vals = resolve_tile(k, st.vals)
                slots = max(1, (vals.shape[0] if vals.shape else 8) // 8)
                g = scope_work("warp", 32 * 3 * slots)
                raw.count = g
                raw.gbytes = 4.0 * 4 * slots * g
            elif isinstance(st, OneHot):
                # per lane: 4 target loads per 16-column block, 2 compares + select per packed register
                dst = resolve_tile(k, st.dst)
                cols = dst.shape[-1] if dst.shape else 16
                g = scope_work("warp", 32 * (4 * (cols // 16) + 3 * dst.elems // 64))
                raw.count = g
                raw.simt_ops = 32 * 3 * dst.elems // 64 * g
                raw.smem_bytes = 4.0 * 32 * 4 * (cols // 16) * g
            elif isinstance(st, ScatterAdd):
                idx = resolve_tile(k, st.index)
                dst = resolve_tile(k, st.dst)
                rows = idx.shape[0] if idx.shape else 16
                cols = resolve_tile(k, st.src).shape[-1] if st.src is not None else 1
                # one red (+ one src load) per element; f32 into shared memory is a CAS loop instead
                cas = dst.space == "smem" and dst.dtype == "f32"
                per = spec.smem_f32_atomic_instrs if cas else 1.0 + 1.0 / st.vec   # a vector red adds vec
                raw.retries = cas
                g = scope_work("warp", per * rows * cols)
                raw.count = g
                if dst.space == "global":
                    raw.gbytes = 4.0 * rows * cols * g
                    raw.mechanism = "atomic"
                    raw.tensor = st.dst.buf
                else:
                    raw.smem_bytes = 4.0 * rows * cols * g
            elif isinstance(st, RedAdd):
                src = resolve_tile(k, st.src)
                if src.space == "reg":      # an accumulator tile: each lane adds its registers (compare + red)
                    g = scope_work("warp", 2.0 * src.elems)
                else:
                    g = scope_work(st.scope, 3.0 * src.elems)       # lds + compare + red per element
                    raw.smem_bytes = 4.0 * src.elems * g
                raw.count = g
                raw.gbytes = 4.0 * src.elems * g
                raw.mechanism = "atomic"
                raw.tensor = st.dst.buf
            elif isinstance(st, (SegmentSums, BucketPlace)):
                _sort_op_cost(m, st, ex, per_iter, raw, resolve_tile)
            elif isinstance(st, LastCta):
                raw.warp_instrs += 8 * warps_exec     # two barriers, fences, one atomic
                raw.count = ex.any * per_iter
            elif isinstance(st, For):
                try:
                    e = dict(ex.env)
                    own = max(0, -(-(int(m.ev.value(st.stop, e)) - int(m.ev.value(st.start, e))) // st.step))
                except (_Unknown, TypeError, ValueError, OverflowError):
                    own = 1     # the body's statements report the unevaluable trip count
                if st.unroll is False:
                    raw.warp_instrs += 3 * warps_exec * own   # per iteration: increment, compare, branch
                raw.count = ex.any * per_iter
                raw.execs_per_warp *= max(1, own)              # its own control runs every iteration
            elif isinstance(st, (If, Let)):
                raw.warp_instrs += 2 * warps_exec
                raw.count = ex.any * per_iter
            else:
                n = 4 if op in ("mbar_wait", "pipe_wait", "pipe_acquire") else 1
                raw.warp_instrs += n * warps_exec
                raw.count = ex.any * per_iter
        except Exception as e:  # noqa: BLE001
            m.assume(f"{site.path}: not costed ({type(e).__name__}: {e})")
        raws.append(raw)

    # ---- occupancy
    smem = _smem_bytes(m)
    rep.smem_bytes = smem
    regs_block, regs_thread = _registers(m)
    rep.regs_per_thread = regs_thread
    limits = {"threads": spec.max_threads_per_sm // max(1, cta_threads), "blocks": spec.max_blocks_per_sm}
    reserve = max(0, spec.smem_per_sm - spec.smem_per_block_max)
    if smem > 0:
        limits["smem"] = spec.smem_per_sm // (smem + reserve)
    if regs_block > 0:
        limits["registers"] = spec.regs_per_sm // regs_block
    limiter = min(limits, key=lambda n: limits[n])
    bps = limits[limiter]
    if bps < 1:
        m.assume(f"one CTA does not fit on an SM ({limiter}); costed as 1 CTA/SM")
        bps = 1
    rep.blocks_per_sm, rep.occupancy_limit = bps, limiter
    capacity = spec.sms * bps
    full, rem = divmod(blocks, capacity)
    rep.waves = full + (1 if rem else 0)
    rep.resident_ctas = min(blocks, capacity)

    # ---- per-CTA sums
    tot = lambda attr: sum(getattr(r, attr) for r in raws)  # noqa: E731
    by_mech: dict[str, float] = {}
    for r in raws:
        if r.gbytes and r.mechanism:
            by_mech[r.mechanism] = by_mech.get(r.mechanism, 0.0) + r.gbytes
    cta = {"gbytes": tot("gbytes"), "smem": tot("smem_bytes"), "wg": tot("flops_wgmma"), "ms": tot("flops_mma"),
           "simt": tot("simt_ops"), "sfu": tot("sfu_ops"), "instrs": tot("warp_instrs")}
    # one warp's own stream: the busiest warp's instructions (a role's share per warp, plus what every
    # warp runs outside roles) at `warp_issue_cycles` each -- a lone warp on its scheduler waits on its
    # own dependences (a warp-specialised producer is bound by this, not by the SM's issue slots)
    by_role: dict = {}
    if m.sass is None:
        for r in raws:
            by_role[r.role] = by_role.get(r.role, 0.0) + r.warp_instrs
        shared = by_role.pop(None, 0.0) / max(1, math.ceil(cta_threads / 32))
        per_warp = {k.roles[ri].name: v / max(1, math.ceil(k.roles[ri].threads / 32)) + shared
                    for ri, v in by_role.items()} or {"cta": shared}
    else:   # compiled code: each node's static SASS x its executions per warp; code outside nodes once
        seen = set()
        for r in raws:
            n = m.sass.get(r.path, 0) * r.execs_per_warp
            seen.add(r.path)
            if r.retries:   # the calibrated per-element cost where the static code runs more than once
                warps = math.ceil((k.roles[r.role].threads if r.role is not None else cta_threads) / 32)
                n = max(n, r.warp_instrs / max(1, warps))
            by_role[r.role] = by_role.get(r.role, 0.0) + n
        shared = by_role.pop(None, 0.0) + sum(n for p, n in m.sass.items() if p not in seen)
        per_warp = {k.roles[ri].name: v + shared for ri, v in by_role.items()} or {"cta": shared}
        cta["instrs"] = sum(per_warp[k.roles[ri].name] * math.ceil(k.roles[ri].threads / 32) for ri in by_role) \
            if by_role else shared * math.ceil(cta_threads / 32)
        m.assume("instruction counts from the compiled SASS (static per node x executions per warp)")
    serial = max(per_warp.values()) * spec.warp_issue_cycles / spec.clock_hz
    rep.per_cta = {"bytes": cta["gbytes"], "bytes_by_mechanism": by_mech, "tensor_flops": cta["wg"] + cta["ms"],
                   "wgmma_flops": cta["wg"], "mma_sync_flops": cta["ms"], "simt_ops": cta["simt"],
                   "sfu_ops": cta["sfu"], "smem_bytes": cta["smem"], "warp_instrs": cta["instrs"],
                   "warp_instrs_per_warp": per_warp}

    # ---- HBM traffic: per tensor min(traffic, footprint)
    traffic: dict[str, float] = {}
    for r in raws:
        if r.gbytes:
            traffic[r.tensor or "?"] = traffic.get(r.tensor or "?", 0.0) + r.gbytes * blocks
    dram = 0.0
    fp_total = 0.0
    for name, t in traffic.items():
        fp = _footprint(m, name)
        if fp is None:
            dram += t
        else:
            fp_total += fp
            dram += min(t, fp)
    total_bytes = cta["gbytes"] * blocks
    if fp_total > spec.l2_bytes and total_bytes > dram:
        m.assume(f"tensors ({_fmt_b(fp_total)}) exceed L2 ({_fmt_b(spec.l2_bytes)}); HBM traffic assumes re-reads "
                 f"still hit L2 (tile rasterization)")
    dram_fraction = dram / total_bytes if total_bytes > 0 else 0.0
    rep.dram_bytes = dram
    rep.totals = {"bytes": total_bytes, "flops": (cta["wg"] + cta["ms"] + cta["simt"]) * blocks,
                  "tensor_flops": (cta["wg"] + cta["ms"]) * blocks, "simt_ops": cta["simt"] * blocks,
                  "sfu_ops": cta["sfu"] * blocks, "warp_instrs": cta["instrs"] * blocks,
                  "smem_bytes": cta["smem"] * blocks}

    # ---- latency streams
    streams = _latency_streams(m, load_sites)
    rep.latency = streams
    role_exposed: dict = {}
    for s in streams:
        role_exposed[s.role] = role_exposed.get(s.role, 0.0) + s.exposed_s
    exposed = max(role_exposed.values(), default=0.0)
    steady = max((s.steady_s for s in streams), default=0.0)

    # ---- rates per SM
    sms = spec.sms
    wg_rate = spec.wgmma_flops if spec.wgmma_flops > 0 else spec.mma_sync_flops
    if cta["wg"] and spec.wgmma_flops <= 0:
        m.assume(f"{spec.name} has no wgmma rate; wgmma costed at the mma_sync rate")
    simt_rate = spec.fp32_flops / 2          # one non-FMA op per lane per cycle = half the FMA FLOP rate

    def wave(R: int, first: bool) -> dict:
        kk = math.ceil(R / sms)
        sub = {
            "tensor": kk * (cta["wg"] / (wg_rate / sms) + cta["ms"] / (spec.mma_sync_flops / sms)),
            "simt": kk * cta["simt"] / (simt_rate / sms),
            "sfu": kk * cta["sfu"] / (spec.sfu_ops / sms),
            "hbm": R * cta["gbytes"] * dram_fraction / spec.hbm_bw,
            "l2": kk * cta["gbytes"] / (spec.l2_bw / sms),
            "instr": kk * cta["instrs"] / (ISSUE_SLOTS_PER_CLOCK * spec.clock_hz),
            "smem": kk * cta["smem"] / spec.smem_bw_per_sm,
            "steady": steady,
            "serial": serial,
        }
        c = max(sub["tensor"], sub["simt"], sub["sfu"])
        mem = max(sub["hbm"], sub["l2"])
        iss = max(sub["instr"], sub["smem"])
        thr = max(c, mem, iss, sub["steady"], sub["serial"])
        t = thr + exposed if (first or kk <= 1) else max(thr, thr / kk + exposed)
        return {"sub": sub, "compute": c, "memory": mem, "issue": iss, "latency": t - max(c, mem, iss), "time": t}

    waves = []
    if full:
        w1 = wave(capacity, True)
        waves.append((1, w1))
        if full > 1:
            waves.append((full - 1, wave(capacity, False)))
    if rem:
        waves.append((1, wave(rem, full == 0)))
    terms = {t: sum(n * w[t] for n, w in waves) for t in TERMS}
    sub_tot: dict[str, float] = {}
    for n, w in waves:
        for s, v in w["sub"].items():
            sub_tot[s] = sub_tot.get(s, 0.0) + n * v
    rep.launch_overhead_s = spec.launch_overhead_s
    terms["latency"] += spec.launch_overhead_s
    rep.terms = terms
    rep.seconds = sum(n * w["time"] for n, w in waves) + spec.launch_overhead_s
    rep.bound = max(TERMS, key=lambda t: terms[t])

    # ---- roofline floor of the whole launch
    tensor_floor = (cta["wg"] / wg_rate + cta["ms"] / spec.mma_sync_flops) * blocks
    rep.roofline_s = max(tensor_floor, cta["simt"] * blocks / simt_rate, cta["sfu"] * blocks / spec.sfu_ops,
                         dram / spec.hbm_bw)

    # ---- per-node attribution: each sub-term's seconds shared by the nodes' raw quantities
    quantity = {
        "tensor": lambda r: r.flops_wgmma / wg_rate + r.flops_mma / spec.mma_sync_flops,
        "simt": lambda r: r.simt_ops, "sfu": lambda r: r.sfu_ops,
        "hbm": lambda r: r.gbytes, "l2": lambda r: r.gbytes,
        "instr": lambda r: r.warp_instrs, "smem": lambda r: r.smem_bytes,
    }
    term_of = {"tensor": "compute", "simt": "compute", "sfu": "compute", "hbm": "memory", "l2": "memory",
               "instr": "issue", "smem": "issue"}
    # The sub-term that decides each term (largest total) is what nodes are charged for.
    winner = {}
    for s, t in term_of.items():
        if t not in winner or sub_tot.get(s, 0) > sub_tot.get(winner[t], 0):
            winner[t] = s
    sums = {s: sum(quantity[s](r) for r in raws) for s in quantity}
    nodes = []
    stream_at = {s.path: s for s in streams}
    lat_total_streams = sum(s.exposed_s + s.steady_s for s in streams)
    lat_kernel = terms["latency"] - spec.launch_overhead_s
    for r in raws:
        nc = NodeCost(path=r.path, kind=r.kind, count=r.count, mechanism=r.mechanism, tensor=r.tensor,
                      bytes=r.gbytes * blocks, smem_bytes=r.smem_bytes * blocks,
                      flops=(r.flops_wgmma + r.flops_mma + r.simt_ops) * blocks, sfu_ops=r.sfu_ops * blocks,
                      warp_instrs=r.warp_instrs * blocks)
        for t, s in winner.items():
            q = quantity[s](r)
            nc.terms[t] = sub_tot.get(s, 0.0) * q / sums[s] if sums[s] > 0 and q > 0 else 0.0
        if r.path in stream_at and lat_total_streams > 0:
            st = stream_at[r.path]
            nc.terms["latency"] = max(0.0, lat_kernel) * (st.exposed_s + st.steady_s) / lat_total_streams
        else:
            nc.terms["latency"] = 0.0
        nc.bound = max(TERMS, key=lambda t: nc.terms.get(t, 0.0))
        nc.seconds = nc.terms.get(nc.bound, 0.0)
        if nc.seconds > 0 or nc.bytes or nc.flops or nc.smem_bytes:
            nodes.append(nc)
    rep.nodes = nodes
    for t in TERMS:
        best = max(nodes, key=lambda n: n.terms.get(t, 0.0), default=None)
        rep.term_paths[t] = best.path if best is not None and best.terms.get(t, 0.0) > 0 else None
    if rep.term_paths["latency"] is None:
        rep.term_paths["latency"] = "/"   # launch overhead: the kernel itself
    rep.binding_path = rep.term_paths.get(rep.bound) or "/"


def _smem_bytes(m: _Model) -> int:
    from .passes import expand, plan_smem

    try:
        expanded, _ = expand(m.k)
    except Exception as e:  # noqa: BLE001
        m.assume(f"expansion failed ({type(e).__name__}); shared memory planned on the source kernel")
        expanded = m.k
    try:
        return plan_smem(expanded).total
    except Exception as e:  # noqa: BLE001
        m.assume(f"shared memory plan failed ({type(e).__name__}); assumed 0 bytes")
        return 0


def _registers(m: _Model) -> tuple[int, float]:
    """(registers per CTA, average per thread): role `regs` where given, else 32 + the 32-bit words of
    the register tiles the role touches, capped at the arch's per-thread limit."""
    from .analysis.tiles import per_thread_elems
    from .dtypes import SIZE
    from .walk import role_statements

    k, spec = m.k, m.spec
    if m.ptxas_regs:
        # ptxas gives every thread of the kernel the same count, allocated per warp in whole units
        regs = -(-int(m.ptxas_regs) // spec.reg_alloc_unit) * spec.reg_alloc_unit
        m.assume(f"registers from ptxas: {m.ptxas_regs}/thread (allocated {regs})")
        return regs * k.launch.threads, float(regs)
    total = 0
    covered = 0
    estimated = []
    for ri, role in enumerate(k.roles):
        if role.regs is not None:
            regs = role.regs
        else:
            names = set()
            for site in role_statements(k, ri):
                for attr in ("src", "dst", "a", "b", "c", "acc"):
                    ref = getattr(site.node, attr, None)
                    if ref is not None and hasattr(ref, "buf"):
                        names.add(ref.buf)
            words = 0
            for b in k.buffers:
                if b.space == "reg" and (b.name in names or b.role == role.name):
                    words += per_thread_elems(b, role.threads, k.launch.threads) * max(1, SIZE.get(b.dtype, 4)) / 4
            regs = int(min(spec.max_regs_per_thread, 32 + math.ceil(words)))
            estimated.append(f"{role.name}~{regs}")
            if 32 + words > spec.max_regs_per_thread:
                m.assume(f"role {role.name}: register tiles need ~{32 + words:.0f} regs/thread (> "
                         f"{spec.max_regs_per_thread}); spills not modelled")
        total += regs * role.threads
        covered += role.threads
    if covered < k.launch.threads:
        total += 32 * (k.launch.threads - covered)
    if estimated:
        m.assume("registers estimated from register tiles: " + ", ".join(estimated))
    return total, total / max(1, k.launch.threads)


def _footprint(m: _Model, name: str) -> Optional[float]:
    from .dtypes import SIZE
    from .nodes import TensorParam

    p = m.k.param(name)
    if not isinstance(p, TensorParam):
        return None
    n = 1
    for i, d in enumerate(p.shape):
        try:
            n *= int(m.ev.value(d, m.values))
        except (_Unknown, TypeError, ValueError):
            m.assume(f"tensor {name}: dim {i} ({d!r}) not evaluable; its HBM traffic is not capped by its size")
            return None
    return float(n * SIZE.get(p.dtype, 4))


def _latency_streams(m: _Model, load_sites) -> list[LatencyStream]:
    """Group loads by (role, innermost loop) and find how many stages hide their latency."""
    from .nodes import Copy, For, PipeOp, WaitGroup
    from .walk import resolve

    k, spec = m.k, m.spec
    groups: dict = {}
    for site, raw, ex in load_sites:
        key = (site.role_index, site.loop_paths[-1] if site.loop_paths else None)
        groups.setdefault(key, []).append((site, raw, ex))
    out = []
    for (ri, loop_path), members in groups.items():
        site0, raw0, ex0 = members[0]
        role_name = k.roles[ri].name if ri is not None else None
        loop = resolve(k, loop_path) if loop_path else None
        st0 = site0.node
        if isinstance(st0, Copy) and st0.kind in ("tma_load", "bulk_load"):
            mech = "tma"     # the bulk copy is the TMA engine's non-tensor form: its latency, its barrier
        elif isinstance(st0, Copy) and st0.kind == "cp_async":
            mech = "cp_async"
        else:
            mech = "ldg"
        lat = spec.tma_latency_s if mech == "tma" else spec.cp_async_latency_s
        stages, pipe_name, rt = 1, None, 0.0
        body_ops = list(_flat(loop.body)) if isinstance(loop, For) else []
        pipes = [op.pipe for op in body_ops if isinstance(op, PipeOp)]
        if pipes and k.pipeline(pipes[0]) is not None:
            p = k.pipeline(pipes[0])
            stages, pipe_name, rt = p.stages, p.name, spec.mbarrier_roundtrip_s
            mech = p.mechanism
            lat = spec.tma_latency_s if mech == "tma" else spec.cp_async_latency_s
        elif mech == "tma" and st0.barrier is not None:
            bar = k.barrier(st0.barrier.name)
            stages = getattr(bar, "count", 1) or 1
            rt = spec.mbarrier_roundtrip_s
        elif mech == "cp_async":
            waits = [op.n for op in body_ops if isinstance(op, WaitGroup) and op.op == "cp_async_wait"]
            stages = 1 + max(waits) if waits else 1
        elif isinstance(loop, For) and loop.unroll:
            # An unrolled loop of independent loads keeps `unroll` of them in flight.
            stages = max(1, ex0.inner_trips if loop.unroll is True else min(ex0.inner_trips, int(loop.unroll)))
        if not isinstance(loop, For):
            stages = max(stages, 1)
        iters = max(ex0.any * ex0.mult for _, _, ex0 in members) if members else 0.0
        if iters <= 0:
            continue
        if stages <= 1:
            exposed, steady = iters * (lat + rt), 0.0
        else:
            exposed, steady = lat, iters * (lat + rt) / stages
        out.append(LatencyStream(path=site0.path, role=role_name, loop=loop_path, mechanism=mech, stages=stages,
                                 iterations=iters, latency_s=lat, exposed_s=exposed, steady_s=steady,
                                 pipeline=pipe_name))
    return out


def _flat(body):
    from .nodes import Block, If

    for st in body:
        yield st
        if isinstance(st, If):
            yield from _flat(st.then)
            yield from _flat(st.else_)
        elif isinstance(st, Block):
            yield from _flat(st.body)


__all__ = ["estimate", "load_constants", "roofline_floor", "ridge_point", "CostReport", "NodeCost",
           "LatencyStream", "DEFAULT_SYMBOL_VALUE", "CALIBRATION_DIR"]
