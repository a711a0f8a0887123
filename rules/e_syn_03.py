"""E-SYN-03: expect-tx bytes must equal the bytes the TMA copies deliver to that barrier phase.

What: for each mbarrier index and phase (one iteration of the loop that indexes it), the bytes
announced by `mbar_expect_tx` must equal the sum of the boxes of the `tma_load` copies that signal the
same barrier index in the same iteration (box = the copy's src tile shape, else the tensor map box,
times the element size; copies inside deeper constant loops count once per iteration), plus the rows
of the `bulk_load` copies that signal it (the rows the executing threads issue: row r goes to the
thread with index r % scope threads in the copy's scope). A `tma_load` / `bulk_load` whose phase has
no `mbar_expect_tx` at all is reported too. `legal` is the byte count the copies deliver; the fix
rewrites `bytes`.

What goes wrong on hardware: the phase completes when the pending arrivals reach zero *and* the
transaction count returns to zero. Announcing more bytes than arrive leaves the tx-count positive
forever: the consumer's `mbarrier.try_wait` never succeeds and the kernel hangs. Announcing fewer
bytes lets the phase complete when the first copies land -- the consumer reads a stage while the rest
of the tile is still being written (wrong results) -- and the late complete_tx bytes underflow into
the next phase, corrupting the protocol.
"""
from cake_ir.analysis import sync
from cake_ir.nodes import Copy, MBarrier, MbarExpectTx

from ._syn_util import barrier_path, safe

CODE = "E-SYN-03"
TITLE = "expect-tx bytes equal the TMA bytes of the phase"
STAGE = "expanded"


@safe
def check(ctx):
    k = ctx.kernel
    ks = sync.get(k)
    groups: dict = {}
    bad: set = set()
    for s in ks.sites:
        n = s.node
        if isinstance(n, MbarExpectTx):
            ref, kind = n.barrier, "expect"
        elif isinstance(n, Copy) and n.kind in ("tma_load", "bulk_load") and n.barrier is not None:
            ref, kind = n.barrier, "copy"
        else:
            continue
        if not isinstance(k.barrier(ref.name), MBarrier):
            continue
        node = sync.norm_index(s, ref.index, k.consts)
        d = sync.phase_loop(s, node)
        key = (ref.name, sync.key_of(node), d, s.role_index, s.loop_paths[d] if d >= 0 else None)
        mult = sync.inner_multiplicity(s, d, k.consts)
        if kind == "expect":
            nbytes = n.bytes
        elif n.kind == "bulk_load":
            m = ks.mask(s)
            nbytes = None if m is None else sync.bulk_issue_bytes(k, ks.space(s.role_index), m, n)
        else:
            nbytes = sync.tile_bytes_of_tma(k, n)
        if mult is None or not nbytes:
            bad.add(key)
            continue
        g = groups.setdefault(key, {"expect": [], "copy": []})
        g[kind].append((s, nbytes * mult, mult))
    # subgroups with copies but no expect: pair with an expect-only subgroup of the same phase key
    for key, g in list(groups.items()):
        if g["copy"] and not g["expect"]:
            mates = [k2 for k2, g2 in groups.items() if k2[:3] == key[:3] and k2 != key and g2["expect"]
                     and not g2["copy"]]
            if len(mates) == 1:
                groups[mates[0]]["copy"].extend(g["copy"])
                g["copy"] = []
    for key, g in groups.items():
        if key in bad:
            continue
        name = key[0]
        bp = barrier_path(k, name)
        exp, cps = g["expect"], g["copy"]
        if cps and not exp:
            s0 = cps[0][0]
            yield ctx.report(s0.path, f"{s0.node.kind} signals {name}[{s0.node.barrier.index}] but no mbar_expect_tx "
                             "announces its bytes in that phase: complete_tx drives the tx-count negative and the "
                             "phase completes (or not) at the wrong time",
                             legal=sum(b for _, b, _ in cps), related=[bp] + [s.path for s, _, _ in cps[1:]])
            continue
        if not exp:
            continue
        want = sum(b for _, b, _ in cps)
        have = sum(b for _, b, _ in exp)
        if want == have:
            continue
        s0, _, m0 = exp[0]
        fix = None
        if len(exp) == 1 and m0 == 1 and want > 0 and not ks.expanded(s0.path):
            fix = [{"op": "replace", "path": s0.path + "/bytes", "value": want}]
        detail = ", ".join(f"{b} B at {s.path}" for s, b, _ in cps) or "no TMA or bulk copy"
        origin = ""
        if ks.expanded(s0.path):
            origin = (" (this expect_tx comes from pipe_acquire: the stage bytes of the pipeline's buffers; the "
                      "copies must fill every buffer of the stage)")
        yield ctx.report(s0.path, f"expect_tx announces {have} bytes on {name}[{s0.node.barrier.index}] but the TMA / "
                         f"bulk copies of that phase deliver {want} ({detail}): "
                         + ("the tx-count never returns to zero and the waiter hangs" if have > want else
                            "the phase completes before all bytes landed")
                         + origin,
                         legal=want, fix=fix, related=[bp] + [s.path for s, _, _ in cps])
