"""E-SYN-04: mbarrier wait parity must follow the phase protocol of the loop.

What: in a loop over `it` that uses slot `X % S` of an mbarrier array with `count` S (X is usually
`it`, or `it + c`), every use of a slot is one phase, so round r = X / S of the slot is phase r:
- a wait for the *peer's arrival in the same iteration* (a "full" barrier: signalled by TMA
  complete_tx, cp_async_arrive, expect_tx, or an arrive issued after writing the stage) must use
  parity `(X / S) % 2`;
- a wait for the *release of the slot's previous use* (an "empty" barrier: arrived by the other role
  after reading the stage, waited before overwriting it) must use `(X / S + 1) % 2`: the first S
  iterations pass at once on a fresh barrier (parity 1 counts as complete before phase 0).
With `count` 1 (no slot index) X is the loop's iteration number. Constant parity inside such a loop is
wrong once the loop runs more than S iterations. Expressions are compared with `expr.same` after
inlining lets, falling back to evaluation over the first iterations; `legal` is the expected parity
and the fix replaces it.

What goes wrong on hardware: `mbarrier.try_wait.parity p` succeeds as soon as the phase with parity
p is complete -- it does not count phases. With a stale parity the wait passes immediately on the
second round (a consumer reads a stage the producer has not refilled yet, a producer overwrites a
stage still being read: silent wrong results), or waits for a phase that is one ahead and hangs.
"""
from cake_ir import expr as E
from cake_ir.analysis import sync
from cake_ir.nodes import Access, CpAsyncArrive, Copy, Fill, Map, MBarrier, MbarArrive, MbarExpectTx, MbarWait, Wgmma

from ._syn_util import barrier_path, safe

CODE = "E-SYN-04"
TITLE = "mbarrier wait parity protocol"
STAGE = "expanded"


def _smem_rw(ks, sites, staged_only=False):
    """Whether `sites` write / read shared memory; `staged_only`: only buffers with stages (the slots a
    barrier array guards: a consumer's private scratch written before it releases a slot is not the
    stage)."""
    k = ks.k
    w = r = False
    for s in sites:
        n = s.node
        if isinstance(n, Wgmma):
            r = r or sync.is_smem(k, n.a) or sync.is_smem(k, n.b)
        elif isinstance(n, (Copy, Access, Fill, Map)):
            for ref, write in sync.smem_refs(n):
                if sync.is_smem(k, ref) and not (staged_only and _unstaged(k, ref)):
                    if write:
                        w = True
                    else:
                        r = True
    return w, r


def _unstaged(k, ref) -> bool:
    b = k.buffer(ref.buf)
    return b is not None and (b.stages or 1) == 1


def _same_iteration_before(ks, site):
    lp = sync.innermost_loop_path(site)
    out = []
    for s in ks.sites:
        if s.role_index != site.role_index or ks.order[s.path] >= ks.order[site.path]:
            continue
        if sync.innermost_loop_path(s) == lp or (lp and s.path.startswith(lp + "/")):
            out.append(s)
    return out


def _same_iteration_after(ks, site):
    lp = sync.innermost_loop_path(site)
    out = []
    for s in ks.sites:
        if s.role_index != site.role_index or ks.order[s.path] <= ks.order[site.path]:
            continue
        if lp and s.path.startswith(lp + "/"):
            out.append(s)
    return out


def _classify(ks, name):
    """'full' (wait for this iteration's signal), 'empty' (wait for the previous use's release) or None."""
    k = ks.k
    decl = k.barrier(name)
    staged_only = isinstance(decl, MBarrier) and decl.count > 1
    for p in k.pipelines:
        if name == f"{p.name}_full":
            return "full"
        if name == f"{p.name}_empty":
            return "empty"
    votes = set()
    for s in ks.sites:
        n = s.node
        if isinstance(n, Copy) and n.kind in ("tma_load", "bulk_load") and n.barrier is not None and \
                n.barrier.name == name:
            votes.add("full")
        elif isinstance(n, (CpAsyncArrive, MbarExpectTx)) and n.barrier.name == name:
            votes.add("full")
        elif isinstance(n, MbarArrive) and n.barrier.name == name:
            w, r = _smem_rw(ks, _same_iteration_before(ks, s), staged_only)
            if w:
                votes.add("full")
            elif r:
                votes.add("empty")
    if len(votes) == 1:
        return votes.pop()
    if votes:
        return None
    # waiter side: waits before writing -> empty, before reading -> full
    for s in ks.sites:
        n = s.node
        if isinstance(n, MbarWait) and n.barrier.name == name and s.loops:
            w, r = _smem_rw(ks, _same_iteration_after(ks, s), staged_only)
            if w and not r:
                votes.add("empty")
            elif r and not w:
                votes.add("full")
    return votes.pop() if len(votes) == 1 else None


def _paren(node) -> str:
    t = sync.text(node)
    return t if isinstance(node, (E.Var, E.Num)) else f"({t})"


@safe
def check(ctx):
    k = ctx.kernel
    ks = sync.get(k)
    kinds: dict = {}
    for s in ks.sites:
        n = s.node
        if not isinstance(n, MbarWait) or not s.loops:
            continue
        decl = k.barrier(n.barrier.name)
        if not isinstance(decl, MBarrier):
            continue
        idx = sync.inline(s, n.barrier.index, k.consts)
        par = sync.inline(s, n.parity, k.consts)
        if idx is None or par is None:
            continue
        S = decl.count
        loop = s.loops[-1]
        if S > 1:
            if not (isinstance(idx, E.Bin) and idx.op == "%" and isinstance(idx.b, E.Num) and idx.b.value == S):
                continue
            X = idx.a
        else:
            ival = E.try_const(idx, dict(k.consts))
            if ival != 0:
                continue
            # a single barrier: each iteration is one phase only if every iteration runs the wait
            inner = [g for g in s.guards if g.path.startswith(s.loop_paths[-1] + "/")]
            if inner:
                continue
            start = sync.inline(s, loop.start, k.consts)
            X = E.Bin("-", E.Var(loop.var), start) if not (isinstance(start, E.Num) and start.value == 0) \
                else E.Var(loop.var)
            if loop.step != 1:
                X = E.Bin("/", X, E.Num(loop.step))
        loop_vars = {lp.var for lp in s.loops}
        if not (E.free_vars(X) & loop_vars):
            continue
        rnd = E.Bin("/", X, E.Num(S)) if S > 1 else X
        full = E.Bin("%", rnd, E.Num(2))
        empty = E.Bin("%", E.Bin("+", rnd, E.Num(1)), E.Num(2))
        # the same expressions spelled with the author's names (for the message and the fix)
        raw = sync.parse_i(n.barrier.index)
        if S > 1 and isinstance(raw, E.Bin) and raw.op == "%":
            xt, dt = _paren(raw.a), _paren(raw.b)
            shown = {"full": f"({xt} / {dt}) % 2", "empty": f"({xt} / {dt} + 1) % 2"}
        elif S == 1:
            xt = _paren(X)
            shown = {"full": f"{xt} % 2", "empty": f"({xt} + 1) % 2"}
        else:
            shown = {"full": sync.text(full), "empty": sync.text(empty)}
        if n.barrier.name not in kinds:
            kinds[n.barrier.name] = _classify(ks, n.barrier.name)
        kind = kinds[n.barrier.name]
        n_inner = 3 * S + 3
        cands = {"full": full, "empty": empty}
        ok = {}
        for nm, e in cands.items():
            ok[nm] = sync.compare_at_site(k, s, par, e, n_inner)
        if kind is not None:
            if ok[kind] is not False:
                continue
            want = shown[kind]
            legal = want
        else:
            if any(v is not False for v in ok.values()):
                continue
            want = None
            legal = [shown["full"], shown["empty"]]
        const = not (E.free_vars(par) & loop_vars)
        what = {"full": "the peer's signal of this iteration (a 'full' barrier)",
                "empty": "the release of the slot's previous use (an 'empty' barrier)",
                None: "its phase"}[kind]
        fix = None
        if want is not None and not ks.expanded(s.path):
            fix = [{"op": "replace", "path": s.path + "/parity", "value": want}]
        msg = (f"wait on {n.barrier.name}[{n.barrier.index}] with parity {n.parity!r} "
               + ("is constant inside the loop" if const else "does not follow the slot's round")
               + f"; it waits for {what}, so the parity must be {legal}"
               + (" (round r of slot X % S is phase r)" if S > 1 else "")
               + ": from the second round on the wait "
               + ("passes on a stale phase (race) or waits for a phase that never comes (hang)"))
        yield ctx.report(s.path, msg, legal=legal, fix=fix, related=[barrier_path(k, n.barrier.name)])
