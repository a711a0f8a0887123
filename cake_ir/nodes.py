"""CAKE IR node types (pydantic v2).

A program is one `Kernel`. Every node sits at a JSON-pointer path (`/roles/1/body/0/body/3`) and may
carry an author `id`; diagnostics, generated C++ comments and backend errors name those paths.
Statements are a discriminated union on `op`; params on `kind`; barriers on `kind`.

Semantics in brief (docs/ir.md has the full reference):
- Execution: every thread runs `prologue`, then the body of the one role whose warp range holds it.
- Buffers: `smem` buffers have a per-stage `shape` and `stages` slots; `reg` buffers are tiles held by
  a thread group (`scope`) and distributed over its threads by `layout`.
- Tiles (`TileRef`) name a buffer (or tensor param), a stage `slot`, an element `offset` per dim and a
  static `shape` (defaults: slot 0, zero offset, the whole buffer).
- Expressions are strings: index expressions (integer, `/` and `%` floor), conditions, and
  element-wise value expressions (see cake_ir.expr).
"""
from __future__ import annotations

import re
from typing import Annotated, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from . import expr as _expr
from .dtypes import DType

IR_VERSION = "0.1"

# ------------------------------------------------------------------------------ field types
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,47}$")
_C_RESERVED = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum", "extern",
    "float", "for", "goto", "if", "inline", "int", "long", "register", "return", "short", "signed", "sizeof",
    "static", "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while", "class",
    "namespace", "template", "typename", "this", "new", "delete", "true", "false", "asm", "bool", "operator",
    "private", "public", "protected", "friend", "virtual", "using", "try", "catch", "throw", "nullptr",
    "constexpr", "static_assert", "decltype", "alignas", "alignof", "threadIdx", "blockIdx", "blockDim",
    "gridDim", "warpSize", "cake", "min", "max", "half", "float2", "float4", "int4", "uint4", "dim3",
    "tid", "lane", "warp", "wg", "role_tid", "role_warp", "smem", "bid", "nbid",
}


def _check_ident(v: str) -> str:
    # fullmatch: `$` in match() also accepts a trailing newline, which would reach the C++ as code
    if not isinstance(v, str) or not _IDENT.fullmatch(v):
        raise ValueError("must be an identifier: a letter or '_' then letters, digits or '_' (at most 48)")
    if v in _C_RESERVED or v.startswith("__") or v.startswith("cake_"):
        raise ValueError(f"{v!r} is reserved (C/CUDA keyword, builtin index name, or cake_/__ prefix)")
    return v


def _check_index(v):
    _expr.parse_index(v)
    return v


def _check_cond(v):
    _expr.parse_cond(v)
    return v


def _check_value(v):
    _expr.parse_value(v)
    return v


def _check_note(v: Optional[str]) -> Optional[str]:
    if v is not None and len(v) > 500:
        raise ValueError("notes are at most 500 characters")
    return v


Ident = Annotated[str, AfterValidator(_check_ident)]
IndexExpr = Annotated[Union[int, str], AfterValidator(_check_index)]
CondExpr = Annotated[Union[bool, str], AfterValidator(_check_cond)]
ValueExpr = Annotated[Union[float, int, str], AfterValidator(_check_value)]
Note = Annotated[Optional[str], AfterValidator(_check_note)]
PosInt = Annotated[int, Field(ge=1, le=2**31 - 1)]
Scope = Literal["thread", "warp", "warpgroup", "role", "cta"]


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    id: Optional[Ident] = Field(default=None, description="optional author id, echoed in diagnostics")
    note: Note = Field(default=None, description="free text; emitted as an escaped C comment")


# ------------------------------------------------------------------------------------ params
class TmaSpec(BaseModel):
    """Request a TMA tensor map for a tensor param; the host builds it with the driver's encoder."""

    model_config = ConfigDict(extra="forbid")
    box: list[PosInt] = Field(description="box shape in the tensor's dim order (outermost first)")
    swizzle: Literal["none", "32B", "64B", "128B"] = "128B"
    oob_fill: Literal["zero", "nan"] = "zero"


class TensorParam(Node):
    kind: Literal["tensor"] = "tensor"
    name: Ident
    dtype: DType
    shape: list[IndexExpr] = Field(min_length=1, max_length=5, description="dims, outermost first")
    strides: Optional[list[IndexExpr]] = Field(default=None, description="element strides; default row-major")
    align: PosInt = Field(default=16, description="guaranteed base-pointer alignment in bytes")
    access: Literal["read", "write", "readwrite"] = "read"
    tma: Optional[TmaSpec] = None


class ScalarParam(Node):
    kind: Literal["scalar"] = "scalar"
    name: Ident
    dtype: Literal["i32", "u32", "i64", "f32"] = "i32"
    min: Optional[int] = Field(default=None, description="proved lower bound (integer params)")
    max: Optional[int] = Field(default=None, description="proved upper bound (integer params)")
    divisible_by: PosInt = 1


Param = Annotated[Union[TensorParam, ScalarParam], Field(discriminator="kind")]


class Launch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grid: list[IndexExpr] = Field(min_length=1, max_length=3, description="blocks per grid dim (x, y, z)")
    threads: PosInt = Field(description="threads per block (1-D)")
    cluster: Optional[list[PosInt]] = Field(default=None, min_length=1, max_length=3)
    min_blocks_per_sm: Annotated[int, Field(ge=1, le=32)] = 1


# ----------------------------------------------------------------------------------- buffers
Layout = Literal[
    "row_major",      # smem: rows of shape[-1] elements (+pad); reg: per-thread array (scope thread)
    "swizzle_32B", "swizzle_64B", "swizzle_128B",  # smem: TMA/wgmma swizzle on byte addresses
    "blocked",        # reg: tile split in chunks of `vec` elements dealt round-robin to the scope's threads
    "mma_a", "mma_b", "mma_acc",   # reg: mma.sync m16n8k16 fragments (scope warp)
    "wgmma_acc",      # reg: wgmma accumulator fragment (scope warpgroup, shape [64*m, N])
    "mma_rows",       # reg: per-row lists beside an mma_acc tile (scope warp, shape [16*m, k]): row r is
                      #      held by the 4 lanes of quad r % 8 (slot 2*(r/16) + (r%16)/8), all k columns each
]


class Buffer(Node):
    name: Ident
    space: Literal["smem", "reg"]
    dtype: DType
    shape: list[PosInt] = Field(min_length=1, max_length=4, description="per-stage tile shape")
    stages: Annotated[int, Field(ge=1, le=16)] = 1
    layout: Layout = "row_major"
    pad: Annotated[int, Field(ge=0, le=64)] = Field(default=0, description="row_major smem: elements of padding per row")
    vec: Annotated[int, Field(ge=1, le=16)] = Field(default=1, description="blocked: elements per thread chunk")
    scope: Scope = Field(default="thread", description="reg: the thread group that holds the whole tile")
    role: Optional[Ident] = Field(default=None, description="owner role (reg buffers, or smem written by one role)")


# ---------------------------------------------------------------------------------- barriers
class MBarrier(Node):
    kind: Literal["mbarrier"] = "mbarrier"
    name: Ident
    count: Annotated[int, Field(ge=1, le=64)] = Field(default=1, description="array length (one per stage)")
    arrivals: PosInt = Field(description="arrivals that complete a phase")


class NamedBarrier(Node):
    kind: Literal["named"] = "named"
    name: Ident
    bar_id: Annotated[int, Field(ge=0, le=15)]
    threads: PosInt = Field(description="threads taking part (multiple of 32)")


Barrier = Annotated[Union[MBarrier, NamedBarrier], Field(discriminator="kind")]


class Pipeline(Node):
    """A multi-stage producer/consumer pipeline over staged smem buffers.

    The expand-pipelines pass creates mbarrier arrays `<name>_full` and `<name>_empty` (one per stage),
    initialises them in the prologue and expands the pipe_* statements into explicit mbarrier ops.
    """

    name: Ident
    stages: Annotated[int, Field(ge=1, le=16)]
    mechanism: Literal["tma", "cp_async"]
    producer: Ident
    consumers: list[Ident] = Field(min_length=1)
    buffers: list[Ident] = Field(min_length=1, description="staged smem buffers filled per stage")
    cluster: bool = Field(default=False, description=(
        "slots filled across the thread block cluster (multicast tma_load): a slot is free once every CTA's "
        "consumers released it, so pipe_release arrives on the slot's empty barrier in every CTA of the cluster "
        "and the empty barriers count the whole cluster's consumer warps; needs launch.cluster"))


# --------------------------------------------------------------------------------- operands
class TileRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    buf: Ident = Field(description="a buffer or tensor param name")
    slot: Optional[IndexExpr] = Field(default=None, description="stage slot of a staged smem buffer")
    offset: Optional[list[IndexExpr]] = Field(default=None, description="element offset per dim")
    shape: Optional[list[PosInt]] = Field(default=None, description="static tile shape; default whole buffer")


class BarRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Ident
    index: IndexExpr = 0


# -------------------------------------------------------------------------------- statements
class For(Node):
    op: Literal["for"] = "for"
    var: Ident
    start: IndexExpr = 0
    stop: IndexExpr
    step: PosInt = 1
    unroll: Union[bool, PosInt] = False
    body: list["Stmt"] = Field(default_factory=list)


class If(Node):
    op: Literal["if"] = "if"
    cond: CondExpr
    then: list["Stmt"] = Field(default_factory=list)
    else_: list["Stmt"] = Field(default_factory=list, alias="else")


class Let(Node):
    op: Literal["let"] = "let"
    name: Ident
    value: IndexExpr


class Block(Node):
    """A statement group; passes use it for expansions (`origin` = the sugar node's path)."""

    op: Literal["block"] = "block"
    origin: Optional[str] = None
    body: list["Stmt"] = Field(default_factory=list)


class Copy(Node):
    """Move a tile between memory spaces.

    tma_load: global(tma param) -> smem, one thread issues, completes on `barrier` (complete_tx).
    tma_store: smem -> global(tma param), one thread issues; tma_store_commit/wait track it.
    cp_async: global -> smem, `scope` threads cooperate in chunks of `vec_bytes`.
    sync: global -> smem through registers, `scope` threads cooperate.
    bulk_load (sm_90a): global (any tensor param, no tensor map) -> row_major smem with the non-tensor
      bulk copy `cp.async.bulk...mbarrier::complete_tx::bytes`: one copy per tile row (the last dim's
      contiguous run; a padded smem pitch is fine), rows dealt round-robin to the `scope` threads; the
      rows complete on `barrier` as transaction bytes (announce them with mbar_expect_tx). Every row is
      a multiple of 16 bytes at 16-byte aligned addresses; there is no predication (`oob` none, the
      tile provably in bounds). `vec_bytes` is unused.
    """

    op: Literal["copy"] = "copy"
    kind: Literal["tma_load", "tma_store", "cp_async", "sync", "bulk_load"]
    src: TileRef
    dst: TileRef
    barrier: Optional[BarRef] = None
    vec_bytes: Literal[4, 8, 16] = 16
    scope: Scope = "role"
    oob: Literal["none", "zfill"] = Field(default="none", description="none: proved in bounds; zfill: predicated")
    multicast: bool = Field(default=False, description=(
        "tma_load only: the tile lands at the same shared-memory offset in every CTA of the cluster and "
        "completes its bytes on the barrier at the same offset in each (.multicast::cluster, every CTA's mask bit)"))


class Access(Node):
    """Register-tile loads/stores. ldg/stg: global<->reg; lds/sts: smem<->reg; ldmatrix: smem->fragment."""

    op: Literal["ldg", "stg", "lds", "sts", "ldmatrix"]
    src: TileRef
    dst: TileRef
    vec_bytes: Literal[2, 4, 8, 16] = 16
    trans: bool = False
    oob: Literal["none", "zfill", "mask"] = "none"
    row_limit: Optional[IndexExpr] = Field(
        default=None, description="stg only: elements whose index in the global tile's first dim is >= "
                                  "row_limit are not written (the end of a sequence in a packed batch)")


class MmaSync(Node):
    """Warp-level mma.sync over fragment tiles: c[TM,TN] += a[TM,TK] * b[TN,TK]^T."""

    op: Literal["mma_sync"] = "mma_sync"
    shape: tuple[int, int, int] = (16, 8, 16)
    a: TileRef
    b: TileRef
    c: TileRef


class Wgmma(Node):
    """Warpgroup wgmma over a K slab: acc[64,N] (+)= a[64,TK] * b[N,TK]^T, issued in k16 steps. `a` is an
    smem tile (K-major) or an mma_a register fragment [16, 16] per warp (warp w of the warpgroup holds rows
    16 w .. 16 w + 15; one k16 step). `b_major` "mn": b is an smem tile [TK, N] of K rows with N contiguous
    (one swizzle atom wide), acc (+)= a * b (with A in registers)."""

    op: Literal["wgmma"] = "wgmma"
    shape: tuple[int, int, int]
    a: TileRef
    b: TileRef
    acc: TileRef
    accumulate: CondExpr = Field(default=True, description="false/expr: first k step overwrites acc")
    b_major: Literal["k", "mn"] = Field(default="k", description="b stored [N, TK] (k) or [TK, N] (mn)")
    b_atom_rows: Optional[int] = Field(default=None, description="mn: b's tile is the first swizzle atom [TK, 64]; "
                                       "N spans N / 64 atoms, each this many rows after the previous one in b's "
                                       "buffer (the descriptor's leading byte offset)")


class MbarInit(Node):
    op: Literal["mbar_init"] = "mbar_init"
    barrier: BarRef
    arrivals: PosInt


class MbarArrive(Node):
    """Every executing thread arrives once; guard with an `if` for one arrival per warp/role. cluster: once on
    the barrier at the same offset in every CTA of the cluster (mapa + a remote arrive)."""

    op: Literal["mbar_arrive"] = "mbar_arrive"
    barrier: BarRef
    cluster: bool = False


class MbarExpectTx(Node):
    """arrive.expect_tx: the executing thread arrives and adds `bytes` to the phase's tx count."""

    op: Literal["mbar_expect_tx"] = "mbar_expect_tx"
    barrier: BarRef
    bytes: PosInt


class MbarWait(Node):
    op: Literal["mbar_wait"] = "mbar_wait"
    barrier: BarRef
    parity: IndexExpr


class CpAsyncArrive(Node):
    """cp.async.mbarrier.arrive.noinc: arrive when this thread's earlier cp.asyncs land."""

    op: Literal["cp_async_arrive"] = "cp_async_arrive"
    barrier: BarRef


class SimpleSync(Node):
    """cluster_sync: every thread of every CTA of the cluster arrives (release) and waits (acquire)."""
    op: Literal["cp_async_commit", "wgmma_fence", "wgmma_commit", "syncthreads", "syncwarp", "tma_store_commit",
                "cluster_sync"]


class WaitGroup(Node):
    op: Literal["cp_async_wait", "wgmma_wait", "tma_store_wait"]
    n: Annotated[int, Field(ge=0, le=16)] = 0


class NamedBarSync(Node):
    op: Literal["bar_sync", "bar_arrive"]
    barrier: Ident


class Fence(Node):
    op: Literal["fence"] = "fence"
    kind: Literal["proxy_async", "mbarrier_init", "acq_rel_cta", "acq_rel_gpu"]


class PipeOp(Node):
    """Pipeline sugar, expanded by passes.expand_pipelines.

    pipe_acquire (producer): wait until slot iter%S is empty; for tma also arrive.expect_tx with the
    stage's bytes. pipe_commit (producer): for cp_async, arrive on the full barrier when this thread's
    copies land. pipe_wait (consumer): wait until slot iter%S is full. pipe_release (consumer): one lane
    per warp arrives on the empty barrier.
    """

    op: Literal["pipe_acquire", "pipe_commit", "pipe_wait", "pipe_release"]
    pipe: Ident
    iter: IndexExpr


class Fill(Node):
    op: Literal["fill"] = "fill"
    dst: TileRef
    value: float = 0.0


class Map(Node):
    """dst = expr, element-wise; names in expr are reg tiles (broadcast along size-1 dims), scalar
    params, consts or index variables."""

    op: Literal["map"] = "map"
    dst: TileRef
    expr: ValueExpr


class Reduce(Node):
    """Row reduction along the last axis. Register tiles: src's scope reduces (shuffles + scratch).
    `sum_sq` (sum of squares) also reduces an smem tile [R, C] into an smem f32 vector [R] (or [1, R]),
    the rows dealt to the `scope` threads (e.g. the squared norms of a staged database tile; scope
    "warp": each warp reduces its own tile, as a warp-private pipeline does)."""

    op: Literal["reduce"] = "reduce"
    kind: Literal["sum", "max", "min", "sum_sq"]
    src: TileRef
    dst: TileRef
    axis: Annotated[int, Field(ge=0, le=3)] = 1
    scope: Scope = Field(default="role", description="smem src: the threads the rows are dealt to")
    accumulate: bool = Field(default=False, description="smem src: add the row sums to dst instead of "
                             "overwriting it (rows are dealt to the same threads for equal R and scope: a "
                             "[rows, D] tile stored as D / 64 swizzle atoms sums atom by atom)")


class Scan(Node):
    op: Literal["scan"] = "scan"
    kind: Literal["sum", "max"] = "sum"
    src: TileRef
    dst: TileRef
    axis: Annotated[int, Field(ge=0, le=3)] = 1
    exclusive: bool = False


class TopK(Node):
    """Running per-row top-k selection over a register score tile (k = 1 is a running argmin/argmax).

    score[r, j] = scale * src[r, j] + row_bias[r] + col_bias[j]; its index is `col + j` (or
    src_idx[r, j]). Entries with index >= `limit` are skipped. For each row the executing thread holds,
    every element it holds is compared with the thread's k-th best (value, index) pair and, when
    better (smaller for `min`; ties broken by the smaller index), inserted into the sorted list
    `vals`/`idx` (best first). With an `mma_acc` src the lists are `mma_rows` tiles and each of a
    row's 4 lanes keeps a partial list over the columns it holds: `topk_merge` combines them. With a
    per-thread `row_major` src [R, C] the lists are per-thread [R, k] tiles.

    Deferred insertion (`queue_vals` / `queue_idx`, mma_rows [rows, T], k > 1 over mma_acc /
    wgmma_acc scores): a score that passes the row's threshold is pushed onto the lane's queue (a
    register shift) instead of being inserted on the spot, and after each row's scan the warp inserts
    every lane's queue together when some lane's queue is half full; a lane whose queue is full
    inserts on the spot. A divergent insertion costs the warp k steps for every column where any lane
    inserts; deferred, the lanes share the steps. The lists are complete only after the `topk_merge`
    that takes the same queue (E-TOPK-02).

    Shared bound (`shared_bound`, a global i32 [rows, 1] tile, k > 1 over mma_acc / wgmma_acc scores):
    when several CTAs (a split database) or warps score disjoint candidates of the same rows, each
    lane's filter also uses the best bound any of them has published for the row, and publishes its
    quad's bound when it is better (an atomic max of an order-preserving key). Any one quad's k-th
    entry bounds the row's final k-th, so a score strictly worse than a published bound is never in
    the row's top-k: a split's CTAs stop inserting candidates another CTA has already beaten. The
    word 0 stands for "no bound"; the program zeroes the words after the last reader (E-TOPK-03).
    With `bound_cache` (mma_rows f32 [rows, 1] beside the lists) the filter uses the bound read by the
    previous call and issues the next read, off the critical path (a global read is ~0.5 us).

    Given bound (`given_bound`, mma_rows f32 [rows, 1], k > 1 over mma_acc / wgmma_acc scores): a bound
    of each row's k-th best that holds for the whole selection (a sampled search's, loaded before the
    first call): the filter uses the tighter of it and the lists' own, with no global traffic.

    `valid_rows` (k > 1 over mma_acc / wgmma_acc): the score tile's rows from `valid_rows` on are
    padding (e.g. the queries past Q in the last query tile): their lanes still join the warp's
    shuffles but never enter the insertion (a tile of 16 rows with one query inserted for all 16).

    `src_sorted` (per-thread row_major src [R, k] with src_idx): each row of src is itself a sorted top-k
    list (a split's partial list, another lane's list staged in smem), so the two lists are merged by a
    bitonic network (cake::topk_merge_sorted) instead of k insertions. Sortedness is the author's claim:
    an unsorted row gives a wrong selection, not an error.
    """

    op: Literal["topk"] = "topk"
    kind: Literal["min", "max"] = "min"
    k: Annotated[int, Field(ge=1, le=64)]
    src: TileRef
    vals: TileRef
    idx: TileRef
    src_idx: Optional[TileRef] = Field(default=None, description="i32 indices of src's elements (same layout)")
    col: IndexExpr = Field(default=0, description="index of src column 0 (when src_idx is absent)")
    limit: Optional[IndexExpr] = Field(default=None, description="skip indices >= limit (e.g. the column count)")
    scale: float = 1.0
    row_bias: Optional[TileRef] = Field(default=None, description="smem f32 vector, one value per src row")
    col_bias: Optional[TileRef] = Field(default=None, description="smem f32 vector, one value per src column")
    queue_vals: Optional[TileRef] = Field(
        default=None, description="mma_rows f32 [rows, T]: pending entries of a deferred insertion (mma_acc / "
                                  "wgmma_acc scores only; with queue_idx)")
    queue_idx: Optional[TileRef] = Field(
        default=None, description="mma_rows i32 [rows, T]: their indices, -1 = empty (fill with -1 first)")
    shared_bound: Optional[TileRef] = Field(
        default=None, description="global i32 [rows, 1]: a bound on each row's k-th best score that the CTAs "
                                  "(and warps) splitting the row's candidates share (k > 1 over mma_acc / "
                                  "wgmma_acc scores; word 0 = no bound: zero it before, leave it zeroed after)")
    valid_rows: Optional[IndexExpr] = Field(
        default=None, description="rows r >= valid_rows of the score tile hold no candidates (e.g. padded queries): "
                                  "k > 1 over mma_acc / wgmma_acc; their scores never enter the insertion")
    bound_cache: Optional[TileRef] = Field(
        default=None, description="mma_rows f32 [rows, 1]: the shared bound as last read, so that the read for the "
                                  "next call is issued now and its latency hides (fill with the worst score first)")
    given_bound: Optional[TileRef] = Field(
        default=None, description="mma_rows f32 [rows, 1]: a bound of each row's k-th best known before the selection "
                                  "and fixed during it (e.g. loaded by topk_bound from a sampling kernel's words; NaN "
                                  "= none): the filter also uses it, with no global traffic (k > 1 over mma_acc / "
                                  "wgmma_acc scores)")
    src_sorted: bool = Field(
        default=False, description="src (per-thread row_major f32 [R, k], with src_idx) holds top-k lists already sorted "
                                   "best first under the same order (e.g. partial lists of a split search): each row is "
                                   "merged by a bitonic network, ~k log k independent compares instead of k insertions "
                                   "(E-TOPK-05: scale 1, no biases or limit)")
    chains: Annotated[int, Field(ge=1, le=8)] = Field(
        default=1, description="k = 1 over mma_acc / wgmma_acc scores: independent running bests per row, chain c over "
                               "the lane's column pairs n = c, c + chains, ..., joined by the exact (value, index) test "
                               "at the end: the scan's dependent compare-select chain chains times shorter (must divide "
                               "the tile's N / 8); the same result for any value")
    rolled: bool = Field(
        default=False, description="k > 1 over mma_acc / wgmma_acc scores: a row's passing scores enter the insertion "
                                   "through one rolled loop over a bit mask of them (a select chain picks each score) "
                                   "instead of an unrolled insertion per column: one copy of the insertion code per "
                                   "row instead of one per column (the instruction cache); the same result; N <= 256")


class TopKMerge(Node):
    """Merge the partial top-k lists of the lanes that share rows (an `mma_rows` tile: the 4 lanes of
    a quad, by xor shuffles); afterwards every lane of the quad holds the row's merged list.

    With `queue_vals` / `queue_idx` (the queue of a deferred-insertion `topk` on these lists) the lanes
    first insert their pending entries, then empty the queue."""

    op: Literal["topk_merge"] = "topk_merge"
    kind: Literal["min", "max"] = "min"
    vals: TileRef
    idx: TileRef
    queue_vals: Optional[TileRef] = None
    queue_idx: Optional[TileRef] = None


class TopKBound(Node):
    """Move a row's bound of its k-th best between registers and its `shared_bound` word (a global i32
    [rows, 1] tile of order-preserving keys, the `topk` shared bound; word 0 = no bound).

    mode "load": the bound cache `vals` (mma_rows f32 [rows, 1] beside a topk's lists) takes each row's
    word as it is now, so the topk's first call already filters with a bound an earlier kernel left
    (a sampled search's k-th best, `knn_fused(seed=F)`); a word 0 loads as no bound.
    mode "store": the row's word is overwritten with the k-th (last) entry of its sorted list `vals`
    (an mma_rows [rows, k] list after topk_merge: one lane of each quad stores; or a per-thread
    row_major [1, k] list: the thread stores its row's word). A plain store, not an atomic: the caller
    runs after every other writer of the word (e.g. in the last CTA), and what it stores is a valid bound
    for the row only if the list's k entries are distinct candidates of that row, scored exactly as the
    later reader scores them."""

    op: Literal["topk_bound"] = "topk_bound"
    kind: Literal["min", "max"] = "min"
    mode: Literal["load", "store"]
    vals: TileRef
    bound: TileRef


class ScatterAdd(Node):
    """dst[index[r], c] += src[r, c] with hardware atomics (red.shared / red.global .add).

    `index` is an i32 `mma_rows` tile [R, 1] (one target row per src row, e.g. the cluster of each
    point); `src` is an smem or global tile [R, C] of the same rows (absent: adds 1 per row, a count),
    `dst` an smem or global f32/i32 tile [K, C]. The 4 lanes of a row's quad split its C columns.
    Rows with `row0 + r >= row_limit` (e.g. points past N) and rows whose index is negative are skipped.
    """

    op: Literal["scatter_add"] = "scatter_add"
    index: TileRef
    dst: TileRef
    src: Optional[TileRef] = None
    row0: IndexExpr = Field(default=0, description="global row of src row 0 (for row_limit)")
    row_limit: Optional[IndexExpr] = Field(default=None, description="skip rows with row0 + r >= row_limit")
    batch: Annotated[int, Field(ge=1, le=16)] = Field(
        default=1, description="f32 shared-memory adds issued together as overlapped compare-and-swaps (there is "
                               "no native f32 shared atomic add): 8 wins when warps rarely hit the same words, 1 "
                               "(one spin loop per add) when they often do")
    vec: Literal[1, 2, 4] = Field(
        default=1, description="f32 columns per global red instruction (red.global.add.v2/.v4.f32, sm_90 and "
                               "later): each lane adds vec consecutive columns of a row at once, the row's start "
                               "provably 4 vec-byte aligned (E-ATOM-02)")
    load_vec: bool = Field(
        default=False, description="vec 4 with an f16 / bf16 src: each group's four src elements read by one 8-byte "
                                   "load where they are contiguous and 8-byte aligned (checked per group at run time, "
                                   "else one by one)")


class OneHot(Node):
    """dst[m, j] = 1 if index[j] == row0 + m (and col0 + j < limit) else 0: an `mma_a` fragment (f16 /
    bf16) [16 i, 16 j] whose rows are target rows (clusters) and whose columns are source rows
    (points), built from an smem i32 vector of each column's target (e.g. its cluster). With it a
    scatter-add becomes a tensor-core product: sums[row0 : row0 + M, :] += onehot x src, src the
    [C, N] rows as an ldmatrix.trans B operand; an f32 accumulator adds each row exactly once (the
    one-hot factor is exact in f16 / bf16), with no atomic."""

    op: Literal["onehot"] = "onehot"
    index: TileRef
    dst: TileRef
    row0: IndexExpr = Field(default=0, description="target row of fragment row 0")
    col0: IndexExpr = Field(default=0, description="source row of index element 0 (for limit)")
    limit: Optional[IndexExpr] = Field(default=None, description="columns with col0 + j >= limit are zero")


class RedAdd(Node):
    """dst += src element-wise with red.global.add (no return value): an smem tile [R, C] into a global
    tile of the same shape, dealt over the `scope` threads; or an f32 `mma_acc` / `wgmma_acc` register
    tile (an accumulator a warp or warpgroup kept in registers), each lane adding the elements it holds
    (`scope` does not apply). Tile rows r >= row_limit are skipped; zero elements are skipped (nothing to add)."""

    op: Literal["red_add"] = "red_add"
    src: TileRef
    dst: TileRef
    scope: Scope = "cta"
    row_limit: Optional[IndexExpr] = None


class LastCta(Node):
    """Run `body` in the last of `count` CTAs to arrive on a global i32 `counter` (the threadfence
    reduction pattern): every thread fences its earlier global writes (release), one thread
    atomically increments the counter, the CTA learns whether it arrived last, and the last one
    fences again (acquire) and resets the counter to 0 (self-cleaning, so the next launch finds it
    zero). Executed by every thread of the CTA (it synchronises the CTA)."""

    op: Literal["last_cta"] = "last_cta"
    counter: TileRef
    count: IndexExpr
    body: list["Stmt"] = Field(default_factory=list)


class ArriveWait(LastCta):
    """Every CTA arrives on a global i32 `counter` as in last_cta (every thread fences its earlier global
    writes, one thread increments the counter); the CTAs where `when` holds (a CTA-uniform condition over
    block indices, consts and scalars), `waiters` of them per counter, then wait until all `count` CTAs
    have arrived (acquire) and run `body`, every thread of each; the last of them to finish resets the
    counter to 0 (self-cleaning, so the next launch finds it zero). The split-search merge spread over
    several CTAs instead of the last one, without a second kernel.

    The waiters must be dispatched after the CTAs they wait for: CTAs start in block-index order (x
    fastest), so `when` names the last ones, e.g. `bid.y >= SPLIT - W` on a grid [X, SPLIT] with the
    counter per bid.x."""

    op: Literal["arrive_wait"] = "arrive_wait"
    when: CondExpr
    waiters: IndexExpr


class RowSelect(Node):
    """The k best scores of one row segment, exactly, by every thread of the CTA together (a block-wide
    radix selection: histogram passes over the segment's order-preserving keys in shared memory, a gather of
    the candidates up to the k-th key, a bitonic sort; cake::row_select). For k up to 1024, over segments
    of any length (a distance row written by an earlier kernel).

    Element j (0 <= j < count) of the segment is `src` at its offset plus j along the last dim; its score
    is scale * src[j] + row_bias + col_bias[j] (col_bias read at its own offset plus j), its index
    src_idx[j] (same offsets as src) or col + j. `vals` / `idx` (global [1, k]) take the k best, best
    first (smallest for `min`), ties to the smaller index (with src_idx: equal scores must come in
    increasing index order along the segment, as a partial selection's sorted lists of consecutive
    segments do); entries past count get the worst value (+-3e38) and index -1. `scratch` is an smem
    i32 buffer of at least SELECT_SCRATCH_WORDS words; the op synchronises the CTA before and after
    using it. Executed by every thread of a role that is the whole CTA, outside any `if` (E-SEL-01)."""

    op: Literal["row_select"] = "row_select"
    kind: Literal["min", "max"] = "min"
    k: Annotated[int, Field(ge=1, le=1024)]
    src: TileRef
    count: IndexExpr
    src_idx: Optional[TileRef] = None
    col: IndexExpr = 0
    scale: float = 1.0
    row_bias: Optional[TileRef] = Field(default=None, description="global f32 word [1, 1] added to every score")
    col_bias: Optional[TileRef] = Field(default=None, description="global f32 row: element j added to score j")
    vals: TileRef
    idx: TileRef
    scratch: TileRef


class BucketOffsets(Node):
    """The counting sort's bucket starts: dst[r] = counts[0] + .. + counts[r - 1] for r < count (an exclusive
    prefix sum), by every thread of the CTA together (cake::bucket_offsets: each thread sums a run of buckets,
    a block-wide scan of the runs, the runs written). `counts` is a global f32 (exact integer counts, as a
    scatter_add count leaves them) or i32 tile whose elements are consecutive (a column [count, 1] or a row
    [1, count]); `dst` a global i32 row. `scratch` is an smem i32 buffer of at least 32 words; the op
    synchronises the CTA before and after using it (E-SORT-01)."""

    op: Literal["bucket_offsets"] = "bucket_offsets"
    counts: TileRef
    dst: TileRef
    count: IndexExpr
    scratch: TileRef


class BucketPlace(Node):
    """The counting sort's placement: for each element j < count of `keys` (a global i32 row segment) whose
    key k = keys[j] is not negative, slot p = atomicAdd(&cursor[key_base + k], 1), then ids[p] = id_base + j and
    sorted_keys[p] = key_base + k. The elements are dealt over the role's threads; `cursor` (global i32, its
    tile's offset is bucket 0) starts at the bucket offsets (bucket_offsets) and ends at the next bucket's, so
    the slots of one bucket are consecutive (in no fixed order). `ids` / `sorted_keys`: global i32 tiles whose
    offset is slot 0."""

    op: Literal["bucket_place"] = "bucket_place"
    keys: TileRef
    count: IndexExpr
    cursor: TileRef
    ids: TileRef
    sorted_keys: TileRef
    key_base: IndexExpr = 0
    id_base: IndexExpr = 0


class SegmentSums(Node):
    """dst[keys[p], :] += src[ids[p], :] for the slots p0 <= p < p0 + count of a counting sort (`keys`
    non-decreasing, so each key's rows are one run): the role's threads in groups of D / 8, each thread 8
    consecutive columns (one 16-byte load a row, `unroll` rows in flight), the slots split evenly over the
    groups; a group sums each run in registers and adds it into dst once (red.global.add; .v4 on sm_90), so
    dst takes about one add per run and group instead of one per row (cake::segment_sums). `src`: a global f16
    tile [rows, D] (offset: row 0), D a multiple of 8 and at most 8 x the role's threads; `ids` / `keys`:
    global i32 (offset: slot 0); `dst`: a global f32 tile [rows, D] (offset: row 0)."""

    op: Literal["segment_sums"] = "segment_sums"
    src: TileRef
    ids: TileRef
    keys: TileRef
    dst: TileRef
    p0: IndexExpr
    count: IndexExpr
    unroll: Annotated[int, Field(ge=1, le=8)] = 4


# scratch words of row_select (cake.cuh CAKE_SEL_WORDS: a 4096-bin histogram, 4096 64-bit candidates, 40 words)
SELECT_SCRATCH_WORDS = 4096 + 2 * 4096 + 32 + 8


Stmt = Annotated[
    Union[For, If, Let, Block, Copy, Access, MmaSync, Wgmma, MbarInit, MbarArrive, MbarExpectTx, MbarWait,
          CpAsyncArrive, SimpleSync, WaitGroup, NamedBarSync, Fence, PipeOp, Fill, Map, Reduce, Scan,
          TopK, TopKMerge, TopKBound, OneHot, ScatterAdd, RedAdd, LastCta, ArriveWait, RowSelect,
          BucketOffsets, BucketPlace, SegmentSums],
    Field(discriminator="op"),
]

For.model_rebuild()
If.model_rebuild()
Block.model_rebuild()
LastCta.model_rebuild()
ArriveWait.model_rebuild()


class Role(Node):
    name: Ident
    warps: tuple[Annotated[int, Field(ge=0, le=31)], Annotated[int, Field(ge=1, le=32)]] = Field(
        description="[first warp, warp count]")
    regs: Optional[Annotated[int, Field(ge=24, le=256)]] = Field(
        default=None, description="register budget per thread (setmaxnreg on sm_90a)")
    body: list[Stmt] = Field(default_factory=list)

    @property
    def first_warp(self) -> int:
        return self.warps[0]

    @property
    def num_warps(self) -> int:
        return self.warps[1]

    @property
    def threads(self) -> int:
        return 32 * self.warps[1]


class Kernel(Node):
    ir_version: str = IR_VERSION
    name: Ident
    arch: Literal["sm_80", "sm_86", "sm_89", "sm_90a"]
    launch: Launch
    consts: dict[Ident, int] = Field(default_factory=dict, description="compile-time integer constants")
    params: list[Param] = Field(default_factory=list)
    buffers: list[Buffer] = Field(default_factory=list)
    barriers: list[Barrier] = Field(default_factory=list)
    pipelines: list[Pipeline] = Field(default_factory=list)
    prologue: list[Stmt] = Field(default_factory=list, description="run by every thread before the roles")
    roles: list[Role] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> "Kernel":
        seen: dict[str, str] = {}
        groups = [("consts", list(self.consts)), ("params", [p.name for p in self.params]),
                  ("buffers", [b.name for b in self.buffers]), ("barriers", [b.name for b in self.barriers]),
                  ("pipelines", [p.name for p in self.pipelines]), ("roles", [r.name for r in self.roles])]
        for group, names in groups:
            for i, n in enumerate(names):
                if n in seen:
                    raise ValueError(f"name {n!r} at /{group}/{i} is already used in /{seen[n]}")
                seen[n] = f"{group}/{i}"
        return self

    # ---- lookups
    def param(self, name: str) -> Optional[Union[TensorParam, ScalarParam]]:
        return next((p for p in self.params if p.name == name), None)

    def buffer(self, name: str) -> Optional[Buffer]:
        return next((b for b in self.buffers if b.name == name), None)

    def barrier(self, name: str) -> Optional[Union[MBarrier, NamedBarrier]]:
        return next((b for b in self.barriers if b.name == name), None)

    def pipeline(self, name: str) -> Optional[Pipeline]:
        return next((p for p in self.pipelines if p.name == name), None)

    def role(self, name: str) -> Optional[Role]:
        return next((r for r in self.roles if r.name == name), None)


STMT_TYPES = (For, If, Let, Block, Copy, Access, MmaSync, Wgmma, MbarInit, MbarArrive, MbarExpectTx, MbarWait,
              CpAsyncArrive, SimpleSync, WaitGroup, NamedBarSync, Fence, PipeOp, Fill, Map, Reduce, Scan,
              TopK, TopKMerge, TopKBound, OneHot, ScatterAdd, RedAdd, LastCta, ArriveWait, RowSelect,
              BucketOffsets, BucketPlace, SegmentSums)


# ----------------------------------------------------------------------------------- programs
class Workspace(Node):
    """A global scratch tensor of a Program: allocated by the runtime (not zeroed), written by one
    kernel and read by a later one. Each kernel that touches it declares a TensorParam of this name,
    dtype and shape."""
    name: Ident
    dtype: DType
    shape: list[IndexExpr] = Field(min_length=1, max_length=5,
                                   description="dims over the program's scalar params, outermost first")


class Program(Node):
    """Several kernels launched in order on one stream, sharing the task's tensors and `workspace`
    (stream order makes a kernel's writes visible to the next). For algorithms with a parallel phase
    and a sequential one (KDA: prepare every chunk in parallel, then the state recurrence)."""
    ir_version: str = IR_VERSION
    name: Ident
    arch: Literal["sm_80", "sm_86", "sm_89", "sm_90a"]
    workspace: list[Workspace] = Field(default_factory=list)
    kernels: list[Kernel] = Field(min_length=1, max_length=8)

    @model_validator(mode="after")
    def _unique_names(self) -> "Program":
        for group, names in (("workspace", [w.name for w in self.workspace]),
                             ("kernels", [k.name for k in self.kernels])):
            seen = set()
            for i, n in enumerate(names):
                if n in seen:
                    raise ValueError(f"name {n!r} at /{group}/{i} is already used in /{group}")
                seen.add(n)
        return self

    def workspace_tensor(self, name: str) -> Optional[Workspace]:
        return next((w for w in self.workspace if w.name == name), None)
