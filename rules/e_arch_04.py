"""E-ARCH-04: thread block clusters need sm_90a, at most 8 blocks, and a grid divisible by the
cluster shape.

`launch.cluster` lowers to `__cluster_dims__`; the portable cluster size limit is 8 blocks, and the
launch fails unless every grid dim is a multiple of the cluster dim along it (proved from facts).
"""
from math import prod

from ._cpy_util import fact

CODE = "E-ARCH-04"
TITLE = "cluster launch legality"
STAGE = "source"


def check(ctx):
    k, a = ctx.kernel, ctx.arch
    cl = k.launch.cluster
    if not cl:
        return
    if "cluster" not in a.features:
        yield ctx.report("/launch/cluster", f"clusters need sm_90a (kernel targets {k.arch})", legal=["sm_90a"],
                         fix=[{"op": "remove", "path": "/launch/cluster"}])
        return
    size = prod(cl)
    if size > a.max_cluster_size:
        yield ctx.report("/launch/cluster", f"cluster of {size} blocks exceeds the portable limit of "
                         f"{a.max_cluster_size}", legal=[n for n in (1, 2, 4, 8) if n <= a.max_cluster_size])
    if len(cl) > len(k.launch.grid) and any(c > 1 for c in cl[len(k.launch.grid):]):
        yield ctx.report("/launch/cluster", "cluster has more dims than the grid", legal=len(k.launch.grid))
    for i, (c, g) in enumerate(zip(cl, k.launch.grid)):
        if c > 1 and not fact(ctx.base_env, g).divisible_by(c):
            yield ctx.report(f"/launch/grid/{i}", f"grid dim {i} ({g}) is not provably a multiple of the cluster "
                             f"dim {c}; the launch would fail", related=[f"/launch/cluster/{i}"])
