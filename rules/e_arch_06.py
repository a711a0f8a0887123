"""E-ARCH-06: cluster-wide operations need a thread block cluster.

What: a `tma_load` with `multicast`, an `mbar_arrive` with `cluster`, and a pipeline with `cluster` all act
on every CTA of the kernel's cluster, so the kernel needs `launch.cluster` of more than one CTA (E-ARCH-04
checks its shape); `multicast` is a `tma_load` option only, and a `cluster` pipeline's mechanism is `tma`
(its slots are filled by multicast copies that complete bytes on every CTA's barrier). `legal` names the
fix: declare the cluster (`launch.cluster`, e.g. [2]) or drop the option.

What goes wrong on hardware: without a cluster the multicast mask names CTAs that do not exist and the
remote arrive's `mapa` maps to no shared memory (an illegal-address fault), or, where the mask is only
this CTA, the barriers the pipeline counts for the peers' arrivals and bytes never complete (a hang).
"""
from cake_ir.nodes import Copy, MbarArrive

CODE = "E-ARCH-06"
TITLE = "multicast copies, cluster arrivals and cluster pipelines need a cluster launch"
STAGE = "source"


def _cluster_size(k) -> int:
    n = 1
    for c in k.launch.cluster or [1]:
        n *= c
    return n


def check(ctx):
    k = ctx.kernel
    single = _cluster_size(k) < 2
    fix = {"op": "add", "path": "/launch/cluster", "value": [2]}
    for pi, p in enumerate(k.pipelines):
        if p.cluster and single:
            yield ctx.report(f"/pipelines/{pi}", f"pipeline {p.name!r} is a cluster pipeline (its releases arrive "
                             "in every CTA of the cluster) but the launch has no cluster of 2 or more CTAs",
                             legal={"launch.cluster": [2, 4, 8]}, fix=[fix])
        if p.cluster and p.mechanism != "tma":
            yield ctx.report(f"/pipelines/{pi}", f"cluster pipeline {p.name!r} needs mechanism 'tma' (multicast "
                             f"copies fill its slots), got {p.mechanism!r}", legal=["tma"],
                             fix=[{"op": "replace", "path": f"/pipelines/{pi}/mechanism", "value": "tma"}])
    for s in ctx.sites:
        n = s.node
        if isinstance(n, Copy) and n.multicast:
            if n.kind != "tma_load":
                yield ctx.report(s.path, f"multicast is a tma_load option; copy kind {n.kind!r} delivers to this "
                                 "CTA only", legal=["tma_load"],
                                 fix=[{"op": "remove", "path": f"{s.path}/multicast"}])
            elif single:
                yield ctx.report(s.path, "multicast tma_load needs a cluster of 2 or more CTAs (launch.cluster)",
                                 legal={"launch.cluster": [2, 4, 8]}, fix=[fix])
        elif isinstance(n, MbarArrive) and n.cluster and single:
            yield ctx.report(s.path, "a cluster arrive (one in every CTA of the cluster) needs launch.cluster of 2 "
                             "or more CTAs", legal={"launch.cluster": [2, 4, 8]}, fix=[fix])
