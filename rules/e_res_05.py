"""E-RES-05: a role's register tiles do not fit its register budget.

Each reg buffer a role holds costs per-thread registers by its layout (`tiles.per_thread_elems`,
counted in 32-bit registers: two bf16 per register). The most of them live at once (a tile lives from
its first to its last use, across every loop it is used in; the two sides of an if/else count once)
plus ~16 registers of overhead (addresses, counters, predicates) must fit the role's budget (`regs`, else the per-thread maximum:
255, or regs_per_sm / threads for large blocks, e.g. 64 at 1024 threads), or the compiler
spills to local memory (wgmma accumulators cannot spill at all). Example: a wgmma_acc [64, 256] f32
is 128 registers per thread, more than a role with regs = 96 can hold. Tiles that are never live
together share registers (ptxas allocates by live range): a split kNN search's top-k lists die before
its last CTA's merge lists are born (at k = 32 their sum was ~300 registers, ptxas used 254, no spills).

setmaxnreg moves registers between roles at run time, but ptxas still compiles every instruction
under the launch cap (`__launch_bounds__(threads, min_blocks)`: regs_per_sm / threads). A wgmma's
accumulators are one instruction's operands, so they plus ~26 registers must fit that cap too.
Found compiling an agent candidate: a 512-thread wgmma GEMM (cap 128) with m64n256 accumulators and
consumer regs 152 passed the budget check and failed in ptxas (C7602: "Insufficient registers (128)
... register target of 154 or higher").
"""
from cake_ir.analysis.tiles import per_thread_elems

from ._res_util import REG_OVERHEAD, launch_regs, role_tile_regs, round_up

WGMMA_OPERAND_OVERHEAD = 26  # descriptors, predicates and addresses live across one wgmma (ptxas C7602)

CODE = "E-RES-05"
TITLE = "register tiles exceed the role's register budget"
STAGE = "source"


def check(ctx):
    k, a = ctx.kernel, ctx.arch
    cap = launch_regs(k, a)
    for bi, b in enumerate(k.buffers):
        if b.space == "reg" and b.layout == "wgmma_acc":
            per = per_thread_elems(b, 128, k.launch.threads)
            if per + WGMMA_OPERAND_OVERHEAD > cap:
                yield ctx.report(f"/buffers/{bi}", (
                    f"wgmma accumulator {b.name!r} needs {per} registers per thread in one instruction, plus "
                    f"~{WGMMA_OPERAND_OVERHEAD}; ptxas compiles under the launch cap of {cap} "
                    f"({k.launch.threads} threads, min_blocks_per_sm {k.launch.min_blocks_per_sm}) whatever "
                    f"setmaxnreg later grants: use fewer threads per block or a narrower accumulator"),
                    related=["/launch/threads"])
    for ri, r in enumerate(k.roles):
        tiles, parts = role_tile_regs(k, ri)
        # Without `regs`, the hard cap is what one resident block can get: regs_per_sm / threads.
        hard = min(a.max_regs_per_thread, a.regs_per_sm // max(1, k.launch.threads) // 8 * 8)
        budget = r.regs if r.regs is not None else hard
        need = tiles + REG_OVERHEAD
        if need <= budget:
            continue
        detail = ", ".join(f"{k.buffers[bi].name}: {n}" for bi, n in sorted(parts, key=lambda p: -p[1]))
        msg = (f"role {r.name!r} holds {tiles} registers per thread in tiles ({detail}) plus ~{REG_OVERHEAD} "
               f"overhead, over its budget of {budget}")
        if r.regs is not None:
            want = round_up(need, 8)
            legal = list(range(want, 257, 8))
            fix = [{"op": "replace", "path": f"/roles/{ri}/regs", "value": want}] if want <= 256 else None
            yield ctx.report(f"/roles/{ri}/regs", msg, legal=legal or None, fix=fix)
        else:
            bi = max(parts, key=lambda p: p[1])[0]
            yield ctx.report(f"/buffers/{bi}", msg + "; split the tile or use fewer per thread",
                             related=[f"/roles/{ri}"])
