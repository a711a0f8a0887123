"""The wide k-means' centroid sums by a counting sort of the assignments, without a red per point and dim.

The assignment kernel (`sums="sorted"`) writes the assignments A and the per-cluster counts WC only; then
1. `kmeans_sums_offsets`: one CTA turns the counts into each cluster's first slot (CUR, an exclusive prefix
   sum over the B*K clusters);
2. `kmeans_sums_place`: every point takes the next slot of its cluster (an atomic increment of CUR), writing
   its row number (IDS) and cluster (SK) there, so each cluster's points are one run of slots;
3. `kmeans_sums_runs`: CTAs of PS slots, in groups of D / 8 threads, read the points' rows in slot order,
   sum each cluster's run in registers and add it into WS once (cake::segment_sums);
and the finalize (tasks.kmeans.wide) divides as before. X is read once more (N x D halves), but WS takes about
one add per run and thread group instead of N x D adds through L2.
"""
from cake_ir.builder import KernelBuilder, tile

from .wide import K_MAX, check_d

OFFSET_THREADS = 1024     # one CTA scans the B*K counts
PLACE_THREADS, PLACE_PER_THREAD = 256, 8
RUN_THREADS, RUN_SLOTS = 256, 2048      # a runs CTA: 256 threads over 2048 slots (D = 1024: two groups of 1024)


def kmeans_sums_offsets(arch: str = "sm_80"):
    """CUR[0, r] = WC[0] + .. + WC[r - 1] for r < R = B*K (the first slot of each cluster's run)."""
    kb = KernelBuilder("kmeans_sums_offsets", arch=arch, grid=[1], threads=OFFSET_THREADS,
                       note="counting sort of the assignments: each cluster's first slot from the counts")
    kb.scalar("R", min=1)
    kb.tensor("WC", "f32", ["R", 1])
    kb.tensor("CUR", "i32", [1, "R"], access="write")
    kb.buffer("scan_words", "smem", "i32", [32])
    with kb.role("main", warps=(0, OFFSET_THREADS // 32)) as r:
        r.add("bucket_offsets", id="cluster_offsets", counts=tile("WC", [0, 0]), dst=tile("CUR", [0, 0]), count="R",
              scratch=tile("scan_words"))
    return kb.build()


def kmeans_sums_place(arch: str = "sm_80"):
    """Each point n of batch b takes slot p = CUR[b K + A[b, n]]++: IDS[p] = b N + n, SK[p] = b K + A[b, n];
    grid (cdiv(N, PE), B), PE points a CTA."""
    pe = PLACE_THREADS * PLACE_PER_THREAD
    kb = KernelBuilder("kmeans_sums_place", arch=arch, grid=["cdiv(N, PE)", "B"], threads=PLACE_THREADS,
                       note="counting sort of the assignments: every point into its cluster's next slot")
    kb.const(PE=pe)
    kb.scalar("B", min=1)
    kb.scalar("N", min=1)
    kb.scalar("K", min=1, max=K_MAX)
    kb.tensor("A", "i32", ["B", "N"])
    kb.tensor("CUR", "i32", [1, "B * K"], access="readwrite")
    kb.tensor("IDS", "i32", [1, "B * N"], access="write")
    kb.tensor("SK", "i32", [1, "B * N"], access="write")
    with kb.role("main", warps=(0, PLACE_THREADS // 32)) as r:
        r.let("b", "bid.y")
        r.let("n0", "bid.x * PE")
        r.add("bucket_place", id="place_points", keys=tile("A", ["b", "n0"]), count="min(PE, N - n0)",
              key_base="b * K", id_base="b * N + n0", cursor=tile("CUR", [0, 0]), ids=tile("IDS", [0, 0]),
              sorted_keys=tile("SK", [0, 0]))
    return kb.build()


def kmeans_sums_runs(d: int = 1024, arch: str = "sm_80", unroll: int = 4):
    """WS[SK[p], :] += X[IDS[p], :] over every slot p < B*N, a CTA per RS slots (cake::segment_sums)."""
    check_d(d)
    kb = KernelBuilder(f"kmeans_sums_runs_d{d}" + (f"_u{unroll}" if unroll != 4 else ""), arch=arch,
                       grid=["cdiv(B * N, RS)"], threads=RUN_THREADS,
                       note="the centroid sums from the sorted points: a run of one cluster summed, added once")
    kb.const(D=d, RS=RUN_SLOTS)
    kb.scalar("B", min=1)
    kb.scalar("N", min=1)
    kb.scalar("K", min=1, max=K_MAX)
    kb.tensor("X", "f16", ["B * N", "D"])
    kb.tensor("IDS", "i32", [1, "B * N"])
    kb.tensor("SK", "i32", [1, "B * N"])
    kb.tensor("WS", "f32", ["B * K", "D"], access="readwrite")
    with kb.role("main", warps=(0, RUN_THREADS // 32)) as r:
        r.let("p0", "bid.x * RS")
        r.add("segment_sums", id="cluster_sums", src=tile("X", [0, 0], [1, d]), ids=tile("IDS", [0, 0]),
              keys=tile("SK", [0, 0]), dst=tile("WS", [0, 0], [1, d]), p0="p0", count="min(RS, B * N - p0)",
              unroll=unroll)
    return kb.build()
