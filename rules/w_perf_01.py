"""W-PERF-01: shared-memory accesses on a row_major buffer hit the same banks (bank conflicts).

Shared memory has 32 four-byte banks; a 128-byte wavefront serves a warp only if its addresses fall
in distinct banks. `ldmatrix` reads 8 rows of 16 bytes per matrix, and fragment-layout lds/sts
touch 8 rows of 16 bytes per phase (16-bit pairs), or 4 rows of 32 bytes (f32 pairs, a half-warp per
phase): when the row pitch is a multiple of 128 bytes (or of 64) those rows share banks (up to 8-way
conflicts). Plain row-wise accesses conflict when a row run is shorter than 128 bytes and the pitch is
a multiple of 128. Fix: pad each row by 16 bytes (`pad` 8 for 16-bit, 4 for f32; 32 bytes, `pad` 8,
for f32 accumulator pairs) or use a swizzled layout (required when TMA reads or writes the buffer).
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import Access, Copy

from ._cpy_util import FRAGMENT_LAYOUTS, esize, tile_shape

CODE = "W-PERF-01"
TITLE = "shared-memory bank conflicts from the row pitch"
STAGE = "expanded"


def degree(pitch: int, seg: int, rows: int) -> int:
    """Worst bank multiplicity when `rows` rows each access `seg` bytes at the same column."""
    count = [0] * 32
    for r in range(rows):
        start = r * pitch
        for byte in range(start - start % 4, start + seg, 4):
            count[(byte // 4) % 32] += 1
    return max(count) if count else 1


def _access(k, n):
    """(smem tile, other tile, op name) of a shared-memory access, or None."""
    if isinstance(n, Access) and n.op in ("ldmatrix", "lds"):
        return resolve_tile(k, n.src), resolve_tile(k, n.dst), n.op
    if isinstance(n, Access) and n.op == "sts":
        return resolve_tile(k, n.dst), resolve_tile(k, n.src), n.op
    if isinstance(n, Copy) and n.kind in ("cp_async", "sync"):
        return resolve_tile(k, n.dst), resolve_tile(k, n.src), n.kind
    return None


def check(ctx):
    k = ctx.kernel
    tma_written = set()  # buffers TMA reads or writes: their rows must stay dense, so no pad fix
    for s in ctx.sites:
        if isinstance(s.node, Copy) and s.node.kind in ("tma_load", "tma_store"):
            tma_written |= {s.node.src.buf, s.node.dst.buf}
    seen = set()
    for s in ctx.sites:
        acc = _access(k, s.node)
        if acc is None:
            continue
        sm, other, op = acc
        b = sm.buffer
        if b is None or b.space != "smem" or b.layout != "row_major" or len(b.shape) < 2 or b.name in seen:
            continue
        es = esize(b.dtype)
        shp = tile_shape(k, sm)
        if not es or shp is None:
            continue
        rows_in_buf = 1
        for d in b.shape[:-1]:
            rows_in_buf *= d
        pitch = (b.shape[-1] + b.pad) * es
        ob = other.buffer
        if op == "ldmatrix":
            seg, rows = 16, 8
        elif ob is not None and ob.space == "reg" and ob.layout in FRAGMENT_LAYOUTS:
            # a lane moves an element pair (2 es bytes) and a row's 4 lanes 8 es bytes; one wavefront
            # serves 128 bytes of lanes: 8 rows for pairs up to 4 bytes, a half-warp's 4 rows for f32 pairs
            seg, rows = 8 * es, (8 if 2 * es <= 4 else 4)
        else:
            seg = shp[-1] * es
            if seg >= 128 or pitch % 128:
                continue
            rows = 128 // max(1, seg)
        rows = min(rows, rows_in_buf, max(1, shp[-2] if len(shp) >= 2 else 1))
        if rows < 2:
            continue
        deg = degree(pitch, seg, rows)
        if deg <= 1:
            continue
        seen.add(b.name)
        bi = k.buffers.index(b)
        # 16 bytes of pad fix 16-byte runs; 8-byte pairs over 4 rows need 32
        pads = [p for p in (max(1, 16 // es), max(1, 32 // es)) if degree((b.shape[-1] + p) * es, seg, rows) <= 1]
        pad = pads[0] if pads else max(1, 16 // es)
        fix = None
        if b.name not in tma_written and pads:
            fix = [{"op": "replace", "path": f"/buffers/{bi}/pad", "value": pad}]
        legal = {"layout": ["swizzle_32B", "swizzle_64B", "swizzle_128B"]}
        if b.name not in tma_written:
            legal = {"pad": [pad], **legal}
        yield ctx.report(s.path, f"{op} on {b.name!r}: row pitch {pitch} bytes puts {rows} rows in the same banks "
                         f"({deg}-way bank conflict)", legal=legal, fix=fix, related=[f"/buffers/{bi}"])
