"""Seed programs for row softmax, written with the builder; `python -m tasks.export_seeds` writes
them to seeds/*.json (the files CI verifies and compiles)."""
from tasks.base import signature_defaults
from cake_ir.builder import KernelBuilder, tile


def softmax_row(n: int = 4096, warps: int = 8, vec: int = 8):
    """One CTA per row; the row lives in registers (blocked, 16-byte chunks), two CTA-wide
    reductions (max, sum), one read and one write of HBM per element."""
    threads = 32 * warps
    vb = None if vec * 2 >= 16 else vec * 2   # bytes per thread chunk of bf16 (16 is the default)
    kb = KernelBuilder(f"softmax_row_n{n}", arch="sm_90a", grid=["M"], threads=threads,
                       note="row softmax, one CTA per row, row held in registers")
    kb.const(N=n)
    kb.scalar("M", min=1)
    kb.tensor("X", "bf16", ["M", "N"])
    kb.tensor("Y", "bf16", ["M", "N"], access="write")
    kb.buffer("xb", "reg", "bf16", [1, n], layout="blocked", vec=vec, scope="cta")
    kb.buffer("xf", "reg", "f32", [1, n], layout="blocked", vec=vec, scope="cta")
    kb.buffer("mx", "reg", "f32", [1, 1], scope="thread")
    kb.buffer("sm", "reg", "f32", [1, 1], scope="thread")
    with kb.role("main", warps=(0, warps)) as r:
        r.ldg(tile("X", ["bid.x", 0], [1, n]), tile("xb"), vec_bytes=vb, id="load_row")
        r.map("xf", "xb")
        r.reduce("max", "xf", "mx", id="row_max")
        r.map("xf", "exp2((xf - mx) * 1.4426950408889634)")
        r.reduce("sum", "xf", "sm", id="row_sum")
        r.map("xb", "xf * recip(sm)")
        r.stg(tile("xb"), tile("Y", ["bid.x", 0], [1, n]), vec_bytes=vb, id="store_row")
    return kb.build()


SEEDS = {"softmax_row_n4096": lambda: softmax_row(4096)}


# Parameter spaces of the seed generator, for family tactics (tactics/family.py). The row length is
# the task's (4096), not a tunable.
FAMILIES = {
    "softmax_row_n4096": {
        "make": softmax_row,
        "defaults": signature_defaults(softmax_row),
        "space": {"warps": [1, 2, 4, 8, 16, 32], "vec": [1, 2, 4, 8]},
        "check": lambda p: p["n"] % (32 * p["warps"] * p["vec"]) == 0,
        "tactics": {},   # warps and vector width are IR tactics (cta_warps, vector_width)
    },
}
