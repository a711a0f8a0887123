"""E-CPY-02: a TMA copy does not match its tensor map.

The host encodes one `CUtensorMap` per TMA param from `tma.box` and `tma.swizzle`, so every
`tma_load`/`tma_store` tile must have exactly the box shape. The driver also requires: each box dim
<= 256; the inner box extent a multiple of 16 bytes and, with a swizzle, at most the swizzle span
(32/64/128 bytes); global strides (all but the innermost) multiples of 16 bytes and a 16-byte
aligned base. The smem side must be laid out as TMA writes it: `swizzle_128B` <-> "128B" (etc.),
`row_major` without padding <-> "none", rows equal to the box's inner extent, and a 128-byte
aligned destination.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import Copy, TensorParam

from ._cpy_util import div_ok, esize, offsets, squeeze, strides, tile_shape

CODE = "E-CPY-02"
TITLE = "TMA box, swizzle and stride constraints"
STAGE = "expanded"

SPAN = {"32B": 32, "64B": 64, "128B": 128}
LAYOUT = {"none": "row_major", "32B": "swizzle_32B", "64B": "swizzle_64B", "128B": "swizzle_128B"}


def _param_checks(ctx, pi, p):
    es = esize(p.dtype)
    box = p.tma.box
    base = f"/params/{pi}/tma"
    if len(box) != len(p.shape):
        yield ctx.report(f"{base}/box", f"TMA box has {len(box)} dims but {p.name!r} has {len(p.shape)}",
                         legal=len(p.shape))
        return
    for d, b in enumerate(box):
        if b > 256:
            yield ctx.report(f"{base}/box/{d}", f"TMA box dim {d} is {b}; the limit is 256",
                             legal=list(range(1, 257)) if d != len(box) - 1 else [256])
    inner = box[-1] * es
    last = f"{base}/box/{len(box) - 1}"
    if inner % 16:
        yield ctx.report(last, f"TMA inner box extent is {inner} bytes; it must be a multiple of 16",
                         legal=list(range(max(1, 16 // es), 257, max(1, 16 // es))))
    span = SPAN.get(p.tma.swizzle)
    if span and inner > span:
        yield ctx.report(last, f"TMA inner box extent {inner} bytes exceeds the {p.tma.swizzle} swizzle span",
                         legal=[span // es], fix=[{"op": "replace", "path": last, "value": span // es}])
    if p.align % 16:
        yield ctx.report(f"/params/{pi}/align", f"TMA needs a 16-byte aligned base; {p.name!r} guarantees {p.align}",
                         legal=[16, 32, 64, 128, 256],
                         fix=[{"op": "replace", "path": f"/params/{pi}/align", "value": 16}])
    st = strides(resolve_tile(ctx.kernel, _ref(p.name)))
    if st is not None and es:
        for d in range(len(st) - 1):
            if not div_ok(ctx.base_env, st[d], max(1, 16 // es)):
                yield ctx.report(f"/params/{pi}/shape" if p.strides is None else f"/params/{pi}/strides/{d}",
                                 f"TMA global stride of dim {d} ({st[d]} elements) is not provably a multiple of "
                                 f"16 bytes; declare divisible_by on the dims", legal=[f"multiple of {16 // es}"])
                break


def _ref(name):
    from cake_ir.nodes import TileRef
    return TileRef(buf=name)


def check(ctx):
    k = ctx.kernel
    for pi, p in enumerate(k.params):
        if isinstance(p, TensorParam) and p.tma is not None:
            yield from _param_checks(ctx, pi, p)
    for s in ctx.sites:
        n = s.node
        if not isinstance(n, Copy) or n.kind not in ("tma_load", "tma_store"):
            continue
        gf, sf = ("src", "dst") if n.kind == "tma_load" else ("dst", "src")
        g, sm = resolve_tile(k, getattr(n, gf)), resolve_tile(k, getattr(n, sf))
        if not g.known or not sm.known:
            continue
        p = g.param
        if p is None:
            continue  # E-CPY-05: the global side must be a tensor param
        pi = k.params.index(p)
        if p.tma is None:
            yield ctx.report(f"{s.path}/{gf}/buf", f"{n.kind} needs a TMA tensor map but param {p.name!r} has no "
                             "`tma` spec", related=[f"/params/{pi}"])
            continue
        box = list(p.tma.box)
        gshape = tile_shape(k, g, sm)
        if gshape is not None and list(gshape) != box:
            yield ctx.report(f"{s.path}/{gf}/shape", f"{n.kind} tile {list(gshape)} differs from the tensor map box "
                             f"{box} of {p.name!r}", legal=[box],
                             fix=[{"op": "replace", "path": f"{s.path}/{gf}/shape", "value": box}])
        b = sm.buffer
        if b is None or b.space != "smem":
            continue
        want = LAYOUT[p.tma.swizzle]
        if b.layout != want or (want == "row_major" and b.pad):
            bi = k.buffers.index(b)
            got = b.layout + (f" with pad {b.pad}" if b.pad else "")
            fix = [{"op": "replace", "path": f"/buffers/{bi}/layout", "value": want}]
            if b.pad:
                fix.append({"op": "replace", "path": f"/buffers/{bi}/pad", "value": 0})
            yield ctx.report(f"/buffers/{bi}/layout", f"smem buffer {b.name!r} is {got} but {p.name!r}'s tensor map "
                             f"writes swizzle {p.tma.swizzle!r}", legal=[want], fix=fix, related=[s.path])
            continue
        if b.shape[-1] != box[-1]:
            yield ctx.report(f"{s.path}/{sf}", f"smem buffer {b.name!r} rows hold {b.shape[-1]} elements but the box "
                             f"writes rows of {box[-1]}", legal=[box[-1]])
        sshape = tile_shape(k, sm)
        if sshape is not None and squeeze(sshape) != squeeze(box):
            yield ctx.report(f"{s.path}/{sf}", f"smem tile {list(sshape)} does not match the box {box}",
                             legal=[box[-len(sshape):]])
        offs = offsets(sm)
        st = strides(sm)
        es = esize(b.dtype)
        if offs is not None and st is not None and es:
            env = ctx.env(s)
            for d, (o, sd) in enumerate(zip(offs, st)):
                if not div_ok(env, f"({o}) * ({sd})", max(1, 128 // es)):
                    yield ctx.report(f"{s.path}/{sf}/offset/{d}", f"TMA smem address must be 128-byte aligned; "
                                     f"offset {o!r} along dim {d} is not provably so")
                    break
