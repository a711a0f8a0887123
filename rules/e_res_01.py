"""E-RES-01: the kernel's shared memory does not fit the architecture's per-block limit.

The planner (`passes.plan_smem`) lays out every smem buffer (all stages, row padding, 1024-byte
alignment of swizzled buffers), the mbarriers and reduction scratch; the total must not exceed the
opt-in dynamic shared memory limit of the target (227 KiB on sm_90a, 163 KiB on sm_80, 99 KiB on
sm_86/sm_89), or the launch fails. The fix lowers the stage count of the largest staged buffer (or
its pipeline, with the pipeline's buffers) to the largest value that fits.
"""
from cake_ir.passes import expand, plan_smem

CODE = "E-RES-01"
TITLE = "shared memory exceeds the per-block limit"
STAGE = "expanded"


def _fits(ctx, pipe_idx, buf_idxs, stages) -> bool:
    src = ctx.source
    bufs = list(src.buffers)
    for bi in buf_idxs:
        if bi < len(bufs):
            bufs[bi] = bufs[bi].model_copy(update={"stages": stages})
    pipes = list(src.pipelines)
    if pipe_idx is not None and pipe_idx < len(pipes):
        pipes[pipe_idx] = pipes[pipe_idx].model_copy(update={"stages": stages})
    k = src.model_copy(update={"buffers": bufs, "pipelines": pipes})
    try:
        k, _ = expand(k)
        return plan_smem(k).total <= ctx.arch.smem_per_block_max
    except Exception:  # noqa: BLE001 - expansion problems are other rules' business
        return False


def check(ctx):
    k = ctx.kernel
    limit = ctx.arch.smem_per_block_max
    total = plan_smem(k).total
    if total <= limit:
        return
    # The largest staged thing: a pipeline (with its buffers) or a staged buffer outside pipelines.
    cands = []
    in_pipe = set()
    for pi, p in enumerate(ctx.source.pipelines):
        idxs = [i for i, b in enumerate(ctx.source.buffers) if b.name in p.buffers]
        in_pipe |= set(idxs)
        size = sum(_bytes(ctx.source.buffers[i]) * ctx.source.buffers[i].stages for i in idxs)
        if p.stages > 1:
            cands.append((size, f"/pipelines/{pi}/stages", pi, idxs, p.stages))
    for bi, b in enumerate(ctx.source.buffers):
        if b.space == "smem" and b.stages > 1 and bi not in in_pipe:
            cands.append((_bytes(b) * b.stages, f"/buffers/{bi}/stages", None, [bi], b.stages))
    msg = f"shared memory needs {total} bytes; {ctx.arch.name} allows at most {limit} per block"
    if not cands:
        smem = [(bi, _bytes(b) * b.stages) for bi, b in enumerate(k.buffers) if b.space == "smem"]
        node = f"/buffers/{max(smem, key=lambda x: x[1])[0]}" if smem else "/buffers"
        yield ctx.report(node, msg + "; shrink the largest buffer", legal=limit)
        return
    size, node, pi, idxs, stages = max(cands, key=lambda c: c[0])
    best = next((s for s in range(stages - 1, 0, -1) if _fits(ctx, pi, idxs, s)), None)
    fix = None
    if best is not None:
        fix = [{"op": "replace", "path": node, "value": best}]
        if pi is not None:
            fix += [{"op": "replace", "path": f"/buffers/{i}/stages", "value": best}
                    for i in idxs if ctx.source.buffers[i].stages == stages]
        msg += f"; {best} stages fit"
    else:
        msg += "; no stage count fits: shrink the tiles"
    yield ctx.report(node, msg, legal=limit, fix=fix)


def _bytes(b) -> int:
    from cake_ir.passes.plan_smem import stage_bytes
    return stage_bytes(b) if b.space == "smem" else 0
