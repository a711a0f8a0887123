"""A readable text view of a CAKE IR kernel, one line per node, each line naming its JSON pointer.

    /                               kernel gemm  arch sm_90a  grid [N / 256, M / 128]  threads 384
    /params/0                         param A: tensor bf16 [M, K] read align 16  tma box [128, 64] 128B
    ...
    /roles/1                          role consumer  warps [4, +8)  regs 232:
    /roles/1/body/1                     for k in [0, K / 64):
 >> /roles/1/body/1/body/2                wgmma m64n256k16  acc += sA[k % 4][64 * wg:+64, :] * sB[k % 4]^T
                                          ^ E-MMA-02 error: ...

`format_kernel(kernel, mark)` prints the whole kernel; `mark` maps node paths to lines of text
(usually diagnostics) shown under the node, whose line gets a `>>` prefix. A marked path that is not
a printed line (a field such as `/launch/threads`, or a node that only exists after expansion) attaches
to the nearest printed ancestor and the text says which sub-path it is about.
`format_excerpt` prints only the marked lines, their enclosing statements and a few lines of context:
what the CLI shows under each diagnostic.

A Program prints as a header line, its workspace tensors, then each kernel as above, indented one
level under `/kernels/{i}` (the paths are the program document's).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

INDENT = "  "
MARK = ">> "
NOMARK = "   "


@dataclass
class Line:
    path: str
    depth: int
    text: str
    marks: list[str] = field(default_factory=list)
    sub: list[str] = field(default_factory=list)   # sub-paths of marks attached here (aligned with marks)
    parents: tuple[int, ...] = ()                  # indices of enclosing lines (for excerpts)


# ------------------------------------------------------------------------------------ helpers
def _e(v) -> str:
    """An index/cond expression as text (strings as written, ints and bools as literals)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _bar(ref) -> str:
    if ref is None:
        return "?"
    return f"{ref.name}[{_e(ref.index)}]"


def tile(ref, kernel=None) -> str:
    """`buf[slot][o0:+s0, o1:+s1]`; a zero offset with the whole extent prints as `:`."""
    if ref is None:
        return "?"
    s = ref.buf
    if ref.slot is not None:
        s += f"[{_e(ref.slot)}]"
    offs = list(ref.offset) if ref.offset is not None else None
    shape = list(ref.shape) if ref.shape is not None else None
    if offs is None and shape is None:
        return s
    full = None
    if kernel is not None:
        b = kernel.buffer(ref.buf)
        if b is not None:
            full = list(b.shape)
    n = max(len(offs or []), len(shape or []))
    dims = []
    for i in range(n):
        o = _e(offs[i]) if offs is not None and i < len(offs) else "0"
        ext = shape[i] if shape is not None and i < len(shape) else None
        whole = ext is None or (full is not None and i < len(full) and full[i] == ext)
        if o == "0" and whole:
            dims.append(":")
        elif ext is None:
            dims.append(f"{o}:")
        else:
            dims.append(f"{'' if o == '0' else o}:+{ext}")
    return s + "[" + ", ".join(dims) + "]"


def _suffix(node) -> str:
    out = ""
    nid = getattr(node, "id", None)
    if nid:
        out += f"  #{nid}"
    note = getattr(node, "note", None)
    if note:
        short = note.replace("\n", " ")
        out += f"  // {short[:80]}{'...' if len(short) > 80 else ''}"
    return out


def stmt_text(st, kernel=None) -> str:
    """One statement as a line of text (without its children)."""
    op = getattr(st, "op", "?")
    t = lambda r: tile(r, kernel)  # noqa: E731
    if op == "for":
        unroll = "" if st.unroll is False else (" unroll" if st.unroll is True else f" unroll {st.unroll}")
        step = "" if st.step == 1 else f" step {st.step}"
        return f"for {st.var} in [{_e(st.start)}, {_e(st.stop)}){step}{unroll}:"
    if op == "if":
        return f"if {_e(st.cond)}:"
    if op == "let":
        return f"let {st.name} = {_e(st.value)}"
    if op == "block":
        return "block" + (f" (from {st.origin})" if st.origin else "") + ":"
    if op == "copy":
        extra = ""
        if st.barrier is not None:
            extra += f"  bar {_bar(st.barrier)}"
        if st.kind in ("cp_async", "sync"):
            extra += f"  vec {st.vec_bytes}B  scope {st.scope}"
        elif st.kind == "bulk_load":
            extra += f"  scope {st.scope}"
        if st.oob != "none":
            extra += f"  oob {st.oob}"
        if st.multicast:
            extra += "  multicast"
        return f"copy.{st.kind} {t(st.dst)} <- {t(st.src)}{extra}"
    if op in ("ldg", "stg", "lds", "sts", "ldmatrix"):
        extra = f"  vec {st.vec_bytes}B" if op != "ldmatrix" else ""
        if st.trans:
            extra += "  trans"
        if st.oob != "none":
            extra += f"  oob {st.oob}"
        return f"{op} {t(st.dst)} <- {t(st.src)}{extra}"
    if op == "mma_sync":
        m, n, k = st.shape
        return f"mma_sync m{m}n{n}k{k}  {t(st.c)} += {t(st.a)} * {t(st.b)}^T"
    if op == "wgmma":
        m, n, k = st.shape
        acc = st.accumulate
        if acc is True:
            rel = "+="
        elif acc is False:
            rel = "="
        else:
            rel = f"(+ if {_e(acc)})="
        return f"wgmma m{m}n{n}k{k}  {t(st.acc)} {rel} {t(st.a)} * {t(st.b)}^T"
    if op == "mbar_init":
        return f"mbar_init {_bar(st.barrier)} arrivals={st.arrivals}"
    if op in ("mbar_arrive", "cp_async_arrive"):
        return f"{op} {_bar(st.barrier)}" + ("  cluster" if getattr(st, "cluster", False) else "")
    if op == "mbar_expect_tx":
        return f"mbar_expect_tx {_bar(st.barrier)} bytes={st.bytes}"
    if op == "mbar_wait":
        return f"mbar_wait {_bar(st.barrier)} parity={_e(st.parity)}"
    if op in ("cp_async_wait", "wgmma_wait", "tma_store_wait"):
        return f"{op} {st.n}"
    if op in ("bar_sync", "bar_arrive"):
        return f"{op} {st.barrier}"
    if op == "fence":
        return f"fence {st.kind}"
    if op in ("pipe_acquire", "pipe_commit", "pipe_wait", "pipe_release"):
        return f"{op} {st.pipe} iter={_e(st.iter)}"
    if op == "fill":
        return f"fill {t(st.dst)} = {st.value:g}"
    if op == "map":
        return f"map {t(st.dst)} = {_e(st.expr)}"
    if op == "reduce":
        return f"reduce.{st.kind} {t(st.dst)} <- {t(st.src)} axis={st.axis}"
    if op == "scan":
        ex = " exclusive" if st.exclusive else ""
        return f"scan.{st.kind} {t(st.dst)} <- {t(st.src)} axis={st.axis}{ex}"
    return str(op)  # simple syncs (syncthreads, wgmma_fence, ...) and anything new


# ------------------------------------------------------------------------------- line builder
def _lines(node) -> list[Line]:
    from .nodes import Program
    if not isinstance(node, Program):
        return _kernel_lines(node)
    out = [Line("/", 0, f"program {node.name}  arch {node.arch}  {len(node.kernels)} kernels in launch order"
                + _suffix(node))]
    for i, w in enumerate(node.workspace):
        out.append(Line(f"/workspace/{i}", 1, f"workspace {w.name}: {w.dtype} [{', '.join(_e(d) for d in w.shape)}]"
                        + _suffix(w), parents=(0,)))
    for i, k in enumerate(node.kernels):
        _kernel_lines(k, out, i, 1, (0,))
    return out


def _kernel_lines(kernel, out: Optional[list[Line]] = None, index: Optional[int] = None, base: int = 0,
                  above: tuple = ()) -> list[Line]:
    """The kernel's lines appended to `out`: with `index`, kernel `index` of a program (paths under
    `/kernels/{index}`, indented `base` levels below the `above` lines)."""
    from .walk import program_path
    out = [] if out is None else out

    def add(path, depth, text, parents=()):
        path = path if index is None else program_path(index, path)
        out.append(Line(path, depth + base, text, parents=tuple(above) + tuple(parents)))
        return len(out) - 1

    k = kernel
    L = k.launch
    grid = ", ".join(_e(g) for g in L.grid)
    head = f"kernel {k.name}  arch {k.arch}  grid [{grid}]  threads {L.threads}"
    if L.cluster:
        head += f"  cluster {list(L.cluster)}"
    if L.min_blocks_per_sm != 1:
        head += f"  min_blocks_per_sm {L.min_blocks_per_sm}"
    root = add("/", 0, head + _suffix(k))
    top = (root,)
    if k.consts:
        add("/consts", 1, "consts: " + ", ".join(f"{n}={v}" for n, v in k.consts.items()), top)
    for i, p in enumerate(k.params):
        if p.kind == "tensor":
            s = f"param {p.name}: tensor {p.dtype} [{', '.join(_e(d) for d in p.shape)}] {p.access}"
            if p.strides is not None:
                s += f" strides [{', '.join(_e(d) for d in p.strides)}]"
            s += f" align {p.align}"
            if p.tma is not None:
                s += f"  tma box {list(p.tma.box)} {p.tma.swizzle}"
                if p.tma.oob_fill != "zero":
                    s += f" oob_fill {p.tma.oob_fill}"
        else:
            s = f"param {p.name}: scalar {p.dtype}"
            facts = []
            if p.min is not None:
                facts.append(f"min {p.min}")
            if p.max is not None:
                facts.append(f"max {p.max}")
            if p.divisible_by != 1:
                facts.append(f"divisible_by {p.divisible_by}")
            if facts:
                s += "  " + " ".join(facts)
        add(f"/params/{i}", 1, s + _suffix(p), top)
    for i, b in enumerate(k.buffers):
        s = f"buffer {b.name}: {b.space} {b.dtype} {list(b.shape)}"
        if b.stages != 1:
            s += f" x{b.stages} stages"
        s += f" {b.layout}"
        if b.pad:
            s += f" pad {b.pad}"
        if b.layout == "blocked":
            s += f" vec {b.vec}"
        if b.space == "reg":
            s += f" scope {b.scope}"
        if b.role:
            s += f" role {b.role}"
        add(f"/buffers/{i}", 1, s + _suffix(b), top)
    for i, b in enumerate(k.barriers):
        if b.kind == "mbarrier":
            s = f"barrier {b.name}: mbarrier x{b.count} arrivals {b.arrivals}"
        else:
            s = f"barrier {b.name}: named id {b.bar_id} threads {b.threads}"
        add(f"/barriers/{i}", 1, s + _suffix(b), top)
    for i, p in enumerate(k.pipelines):
        s = (f"pipeline {p.name}: {p.mechanism} x{p.stages} stages  {p.producer} -> "
             f"{', '.join(p.consumers)}  buffers {', '.join(p.buffers)}" + ("  cluster" if p.cluster else ""))
        add(f"/pipelines/{i}", 1, s + _suffix(p), top)

    def body(stmts, path, depth, parents):
        for i, st in enumerate(stmts):
            p = f"{path}/{i}"
            me = add(p, depth, stmt_text(st, k) + _suffix(st), parents)
            op = getattr(st, "op", None)
            if op in ("for", "block"):
                body(st.body, p + "/body", depth + 1, parents + (me,))
            elif op == "if":
                body(st.then, p + "/then", depth + 1, parents + (me,))
                if st.else_:
                    e = add(p + "/else", depth, "else:", parents)
                    body(st.else_, p + "/else", depth + 1, parents + (e,))

    pro = add("/prologue", 1, "prologue:" + ("" if k.prologue else " (empty)"), top)
    body(k.prologue, "/prologue", 2, top + (pro,))
    for ri, r in enumerate(k.roles):
        regs = f"  regs {r.regs}" if r.regs is not None else ""
        first, count = r.warps
        me = add(f"/roles/{ri}", 1, f"role {r.name}  warps [{first}, +{count}){regs}:" + _suffix(r), top)
        body(r.body, f"/roles/{ri}/body", 2, top + (me,))
    return out


def _attach(lines: list[Line], mark: Optional[Mapping[str, Iterable[str]]]) -> None:
    if not mark:
        return
    index = {ln.path: i for i, ln in enumerate(lines)}
    for path, texts in mark.items():
        path = path or "/"
        texts = [texts] if isinstance(texts, str) else list(texts)
        target, cur = None, path
        while True:
            if cur in index:
                target = index[cur]
                break
            if cur in ("", "/"):
                target = index["/"]
                break
            cur = cur.rsplit("/", 1)[0] or "/"
        ln = lines[target]
        for t in texts:
            ln.marks.append(t)
            ln.sub.append("" if path == ln.path else path)


def _render(lines: list[Line], keep: Optional[set[int]] = None) -> str:
    width = max(len(ln.path) for ln in lines)
    out: list[str] = []
    last = -1
    for i, ln in enumerate(lines):
        if keep is not None and i not in keep:
            continue
        if keep is not None and last >= 0 and i != last + 1:
            out.append(f"{NOMARK}{'':<{width}}  {INDENT * ln.depth}...")
        last = i
        pre = MARK if ln.marks else NOMARK
        out.append(f"{pre}{ln.path:<{width}}  {INDENT * ln.depth}{ln.text}".rstrip())
        for t, sub in zip(ln.marks, ln.sub):
            where = f" (at {sub})" if sub else ""
            text_lines = str(t).splitlines() or [""]
            pad = f"{NOMARK}{'':<{width}}  {INDENT * ln.depth}"
            out.append(f"{pad}^ {text_lines[0]}{where}")
            for extra in text_lines[1:]:
                out.append(f"{pad}  {extra}")
    return "\n".join(out) + "\n"


def format_kernel(kernel, mark: Optional[Mapping[str, Iterable[str]]] = None) -> str:
    """The whole kernel, one node per line, each line starting with its JSON pointer.

    `mark` maps node paths to texts (e.g. diagnostics): the node's line gets a `>>` prefix and each
    text is printed under it. Paths deeper than any printed line attach to the nearest ancestor."""
    lines = _lines(kernel)
    _attach(lines, mark)
    return _render(lines)


def format_excerpt(kernel, mark: Mapping[str, Iterable[str]], context: int = 2) -> str:
    """Only the marked lines with `context` lines around them and the lines of their enclosing
    nodes (kernel header, role, loops, ifs), with `...` where lines were skipped."""
    lines = _lines(kernel)
    _attach(lines, mark)
    keep: set[int] = set()
    for i, ln in enumerate(lines):
        if ln.marks:
            keep.update(range(max(0, i - context), min(len(lines), i + context + 1)))
            keep.update(ln.parents)
    if not keep:
        return ""
    return _render(lines, keep)


def diagnostic_marks(diags) -> dict[str, list[str]]:
    """Marks for `format_kernel`/`format_excerpt` from a list of Diagnostics."""
    mark: dict[str, list[str]] = {}
    for d in diags:
        text = f"{d.code} {d.severity}: {d.message}"
        if d.legal is not None:
            text += f" (legal: {d.legal})"
        mark.setdefault(d.node or "/", []).append(text)
    return mark


__all__ = ["format_kernel", "format_excerpt", "diagnostic_marks", "stmt_text", "tile"]
