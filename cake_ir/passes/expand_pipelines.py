"""Expand pipeline sugar into explicit mbarrier protocol.

For pipeline P with S stages, mechanism m, producer role and consumer roles:
  barriers  P_full[S]  arrivals: tma -> 1 (the producer's arrive.expect_tx), cp_async -> producer threads
            P_empty[S] arrivals: total warps of the consumer roles (one lane per warp releases), times the
                       cluster size for a `cluster` pipeline (each release arrives in every CTA)
  prologue  if tid == 0 { init all }; fence.mbarrier_init; __syncthreads() [+ cluster pipeline: cluster_sync]
  pipe_acquire(it)  -> mbar_wait(P_empty[it%S], parity ((it/S)+1)%2) [+ tma: expect_tx(P_full[it%S], stage bytes)]
  pipe_commit(it)   -> cp_async: cp_async_arrive(P_full[it%S]); tma: nothing (copies complete the tx)
  pipe_wait(it)     -> mbar_wait(P_full[it%S], parity (it/S)%2)
  pipe_release(it)  -> syncwarp; if lane == 0: mbar_arrive(P_empty[it%S]) (cluster pipeline: in every CTA)
The producer's first S waits on `empty` pass at once (parity 1 of a fresh barrier is complete).

Sugar that cannot be expanded into valid nodes (a pipeline name too long for `<name>_empty`, an `iter`
expression too long to wrap) stays unexpanded with an E-PASS-EXPAND diagnostic; the pass never raises.
"""
from __future__ import annotations

from pydantic import ValidationError

from ..diagnostics import Diagnostic
from ..dtypes import size
from ..nodes import (BarRef, Block, Fence, For, If, Kernel, MBarrier, MbarArrive, MbarExpectTx, MbarInit,
                     MbarWait, CpAsyncArrive, PipeOp, SimpleSync)


MAX_TX_BYTES = 2**31 - 1  # an oversized stage is the resource rules' to report; the count stays a valid node


def _problem(path: str, err: ValidationError) -> Diagnostic:
    msg = "; ".join(e.get("msg", "invalid") for e in err.errors(include_url=False)[:3])
    return Diagnostic(code="E-PASS-EXPAND", node=path, message=f"pipeline sugar cannot be expanded: {msg}"[:500])


def stage_bytes(kernel: Kernel, pipe) -> int:
    total = 0
    for name in pipe.buffers:
        b = kernel.buffer(name)
        if b is not None:
            n = 1
            for d in b.shape:
                n *= d
            total += n * size(b.dtype)
    return total


def _expand_op(kernel: Kernel, op: PipeOp, path: str):
    pipe = kernel.pipeline(op.pipe)
    if pipe is None:
        return None
    S, it = pipe.stages, op.iter
    slot = f"({it}) % {S}"
    full, empty = BarRef(name=f"{pipe.name}_full", index=slot), BarRef(name=f"{pipe.name}_empty", index=slot)
    body: list = []
    if op.op == "pipe_acquire":
        body.append(MbarWait(barrier=empty, parity=f"(({it}) / {S} + 1) % 2"))
        if pipe.mechanism == "tma":
            body.append(MbarExpectTx(barrier=full, bytes=min(MAX_TX_BYTES, max(1, stage_bytes(kernel, pipe)))))
    elif op.op == "pipe_commit":
        if pipe.mechanism == "cp_async":
            body.append(CpAsyncArrive(barrier=full))
    elif op.op == "pipe_wait":
        body.append(MbarWait(barrier=full, parity=f"(({it}) / {S}) % 2"))
    elif op.op == "pipe_release":
        body.append(SimpleSync(op="syncwarp"))
        body.append(If(cond="lane == 0", then=[MbarArrive(barrier=empty, cluster=pipe.cluster)]))
    return Block(origin=path, body=body, id=op.id)


def _rewrite(kernel: Kernel, body: list, path: str, diags: list) -> list:
    out = []
    for i, st in enumerate(body):
        p = f"{path}/{i}"
        if isinstance(st, PipeOp):
            try:
                blk = _expand_op(kernel, st, p)
            except ValidationError as e:
                diags.append(_problem(p, e))
                blk = None
            out.append(blk if blk is not None else st)
            continue
        if isinstance(st, For):
            st = st.model_copy(update={"body": _rewrite(kernel, st.body, p + "/body", diags)})
        elif isinstance(st, If):
            st = st.model_copy(update={"then": _rewrite(kernel, st.then, p + "/then", diags),
                                       "else_": _rewrite(kernel, st.else_, p + "/else", diags)})
        elif isinstance(st, Block):
            st = st.model_copy(update={"body": _rewrite(kernel, st.body, p + "/body", diags)})
        out.append(st)
    return out


def _cluster_size(kernel: Kernel) -> int:
    n = 1
    for c in kernel.launch.cluster or [1]:
        n *= c
    return n


def expand_pipelines(kernel: Kernel) -> tuple[Kernel, list[Diagnostic]]:
    if not kernel.pipelines:
        return kernel, []
    barriers = list(kernel.barriers)
    inits = []
    existing = {b.name for b in kernel.barriers}
    diags: list[Diagnostic] = []
    for pi, pipe in enumerate(kernel.pipelines):
        prod = kernel.role(pipe.producer)
        cons = [kernel.role(c) for c in pipe.consumers]
        full_arr = 1 if pipe.mechanism == "tma" else (prod.threads if prod else 1)
        empty_arr = (sum(r.num_warps for r in cons if r is not None) or 1) * (_cluster_size(kernel) if pipe.cluster else 1)
        for name, arr in ((f"{pipe.name}_full", full_arr), (f"{pipe.name}_empty", empty_arr)):
            if name in existing:
                continue
            try:
                bar = MBarrier(name=name, count=pipe.stages, arrivals=arr)
                new_inits = [MbarInit(barrier=BarRef(name=name, index=s), arrivals=arr) for s in range(pipe.stages)]
            except ValidationError as e:
                diags.append(_problem(f"/pipelines/{pi}", e))
                continue
            barriers.append(bar)
            inits.extend(new_inits)
    prologue = list(kernel.prologue)
    if inits:
        # a cluster pipeline's peers multicast into this CTA's slots and arrive on its barriers: none may
        # start before every CTA of the cluster initialised its barriers
        peers = [SimpleSync(op="cluster_sync")] if any(p.cluster for p in kernel.pipelines) else []
        prologue.append(Block(origin="/pipelines", body=[
            If(cond="tid == 0", then=inits), Fence(kind="mbarrier_init"), SimpleSync(op="syncthreads")] + peers))
    roles = []
    for ri, role in enumerate(kernel.roles):
        roles.append(role.model_copy(update={"body": _rewrite(kernel, role.body, f"/roles/{ri}/body", diags)}))
    prologue = _rewrite(kernel, prologue, "/prologue", diags)
    out = kernel.model_copy(update={"barriers": barriers, "prologue": prologue, "roles": roles})
    return out, diags
