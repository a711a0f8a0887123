"""E-RES-02: the thread block shape is illegal.

`launch.threads` must be a multiple of 32 (roles are warp ranges) and at most the architecture's
max threads per block (1024). Every role's warp range `[warps[0], warps[0] + warps[1])` must lie
inside the block, and no two roles may share a warp: each thread runs exactly one role body.
"""
CODE = "E-RES-02"
TITLE = "threads per block and role warp ranges"
STAGE = "source"


def check(ctx):
    k, a = ctx.kernel, ctx.arch
    t = k.launch.threads
    legal = list(range(32, a.max_threads_per_block + 1, 32))
    if t % 32 or t > a.max_threads_per_block:
        fix_v = min(a.max_threads_per_block, -(-t // 32) * 32)
        yield ctx.report("/launch/threads", f"launch.threads = {t} must be a multiple of 32 and at most "
                         f"{a.max_threads_per_block} on {a.name}", legal=legal,
                         fix=[{"op": "replace", "path": "/launch/threads", "value": fix_v}])
    nwarps = t // 32
    need = max((r.first_warp + r.num_warps for r in k.roles), default=0)
    for ri, r in enumerate(k.roles):
        end = r.first_warp + r.num_warps
        if end > nwarps:
            fix = None
            if need * 32 <= a.max_threads_per_block:
                fix = [{"op": "replace", "path": "/launch/threads", "value": need * 32}]
            yield ctx.report(f"/roles/{ri}/warps", f"role {r.name!r} uses warps {r.first_warp}..{end - 1} but "
                             f"the block has {nwarps} warps ({t} threads)", legal=[w for w in range(nwarps)],
                             fix=fix, related=["/launch/threads"])
    for j, rj in enumerate(k.roles):
        for i in range(j):
            ri = k.roles[i]
            lo = max(ri.first_warp, rj.first_warp)
            hi = min(ri.first_warp + ri.num_warps, rj.first_warp + rj.num_warps)
            if lo < hi:
                yield ctx.report(f"/roles/{j}/warps", f"role {rj.name!r} overlaps role {ri.name!r} on warps "
                                 f"{lo}..{hi - 1}; roles must not share warps",
                                 related=[f"/roles/{i}/warps"])
                break
