"""f32 -> f16 row cast in CAKE IR: the k-means loop feeds each iteration's fp32 centroids back to the
next assignment as fp16 (the assignment kernel's mma.sync operand type) without a host round trip."""
from cake_ir.builder import KernelBuilder, tile


def cast_f32_f16(d: int = 128, rows: int = 8, arch: str = "sm_80"):
    threads = 128
    kb = KernelBuilder(f"cast_f32_f16_d{d}", arch=arch, grid=["cdiv(R, RB)"], threads=threads,
                       note="row-block cast f32 -> f16")
    kb.const(D=d, RB=rows)
    kb.scalar("R", min=1)
    kb.tensor("Src", "f32", ["R", "D"])
    kb.tensor("Dst", "f16", ["R", "D"], access="write")
    kb.buffer("v", "reg", "f32", [rows, d], layout="blocked", vec=4, scope="cta")
    with kb.role("main", warps=(0, threads // 32)) as r:
        r.ldg(tile("Src", ["bid.x * RB", 0], [rows, d]), tile("v"), oob="zfill", vec_bytes=16)
        r.stg(tile("v"), tile("Dst", ["bid.x * RB", 0], [rows, d]), oob="mask", vec_bytes=8)
    return kb.build()
