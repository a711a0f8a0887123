"""Shared helpers for the resource rules (E-RES-*, W-RES-04, W-PERF-03): register tiles per role,
the launch register count, and blocks-per-SM occupancy."""
from __future__ import annotations

import math
import re
from typing import Optional

from pydantic import BaseModel

from cake_ir import expr as E
from cake_ir.analysis.tiles import per_thread_elems
from cake_ir.dtypes import SIZE
from cake_ir.nodes import If, Kernel, Role, TileRef
from cake_ir.passes.plan_smem import plan_smem
from cake_ir.walk import role_statements, statements

REG_OVERHEAD = 16          # addresses, loop counters, predicates beyond the tiles
RESERVED_SMEM_PER_BLOCK = 1024  # the driver reserves 1 KiB per resident block (sm_80+)


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _statement_names(node) -> set:
    """Every identifier a statement mentions outside its nested bodies: tile references' buffers and the
    names in its expressions: a superset of the buffers it touches (a role holds more, live ranges err
    long, an if/else side saves less)."""
    out: set = set()

    def walk(v):
        if isinstance(v, TileRef):
            out.add(v.buf)
        elif isinstance(v, BaseModel):
            for f in type(v).model_fields:
                if f not in ("body", "then", "else_"):
                    walk(getattr(v, f, None))
        elif isinstance(v, str):
            out.update(_IDENT.findall(v))
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
    walk(node)
    return out


def role_reg_buffers(k: Kernel, ri: int) -> list:
    """Indices of reg buffers a role holds: owned by it, or used by its statements without an owner."""
    role = k.roles[ri]
    names: set = set()
    for s in role_statements(k, ri):
        names |= _statement_names(s.node)
    out = []
    for bi, b in enumerate(k.buffers):
        if b.space != "reg":
            continue
        if b.role == role.name or (b.role is None and b.name in names):
            out.append(bi)
    return out


def buffer_regs(k: Kernel, b, role: Role) -> int:
    """32-bit registers per thread for one reg buffer."""
    elems = per_thread_elems(b, role.threads, k.launch.threads)
    return -(-elems * SIZE.get(b.dtype, 4) // 4)


def _buffer_uses(k: Kernel, ri: int) -> dict:
    """reg buffer name -> paths of the role's statements that name it."""
    uses: dict = {}
    for s in role_statements(k, ri):
        for n in _statement_names(s.node):
            uses.setdefault(n, []).append(s.path)
    return uses


def _exclusive_saving(k: Kernel, ri: int, parts: list) -> int:
    """Registers never live together: tiles used only under the `then` of an if/else and tiles used only
    under its `else` (e.g. one code path per state layout) can share registers. The largest such
    saving over the role's if/else statements (one of them: the estimate stays conservative)."""
    uses = _buffer_uses(k, ri)
    regs = {k.buffers[bi].name: r for bi, r in parts}
    best = 0
    for s in role_statements(k, ri):
        if not isinstance(s.node, If) or not s.node.else_:
            continue
        sides = []
        for side in ("then", "else"):
            pre = f"{s.path}/{side}/"
            sides.append(sum(r for n, r in regs.items() if uses.get(n) and all(p.startswith(pre) for p in uses[n])))
        best = max(best, min(sides))
    return best


def _live_peak(k: Kernel, ri: int, parts: list) -> int:
    """The most tile registers live at once over the role's statements in program order. A tile lives
    from its first to its last use, stretched over every loop one of its uses sits in (the back edge
    keeps it live across iterations) and over every if/else that holds some of its uses but not all (on
    the other branch it flows through unused); a tile the prologue mentions lives from the role's start,
    one with no use found throughout. E.g. a split search's top-k lists die before the last CTA's merge
    lists are born, so ptxas gives both the same registers."""
    sites = list(role_statements(k, ri))
    if not sites:
        return sum(r for _, r in parts)
    index = {s.path: i for i, s in enumerate(sites)}
    end: dict = {}                      # loop / if path -> index of its last nested statement
    for i, s in enumerate(sites):
        for p in (*s.loop_paths, *(g.path for g in s.guards)):
            end[p] = i
    regs = {k.buffers[bi].name: r for bi, r in parts}
    uses: dict = {}
    for i, s in enumerate(sites):
        for n in _statement_names(s.node) & regs.keys():
            uses.setdefault(n, []).append(i)
    for s in statements(k):             # the prologue's: set before the role's first statement
        if s.role is not None:
            break
        for n in _statement_names(s.node) & regs.keys():
            uses.setdefault(n, []).insert(0, 0)
    last = len(sites) - 1
    span = {}
    for n, idx in uses.items():
        a, b = min(idx), max(idx)
        for i in idx:
            s = sites[i]
            for lp in s.loop_paths:
                a, b = min(a, index[lp]), max(b, end.get(lp, index[lp]))
            for g in s.guards:
                lo, hi = index[g.path], end.get(g.path, index[g.path])
                if any(not lo <= j <= hi for j in idx):
                    a, b = min(a, lo), max(b, hi)
        span[n] = (a, b)
    return max(sum(r for n, r in regs.items() if span.get(n, (0, last))[0] <= i <= span.get(n, (0, last))[1])
               for i in range(len(sites)))


def role_tile_regs(k: Kernel, ri: int) -> tuple[int, list]:
    """(32-bit registers per thread held in reg tiles, [(buffer index, regs)]): the smaller of two upper
    bounds, the sum with the tiles of an if/else's two sides counted once (the larger side, see
    `_exclusive_saving`) and the peak over live ranges (`_live_peak`)."""
    role = k.roles[ri]
    parts = [(bi, buffer_regs(k, k.buffers[bi], role)) for bi in role_reg_buffers(k, ri)]
    return min(sum(r for _, r in parts) - _exclusive_saving(k, ri, parts), _live_peak(k, ri, parts)), parts


def launch_regs(k: Kernel, arch) -> int:
    """Registers per thread the compiler may use under __launch_bounds__(threads, min_blocks)."""
    threads = max(1, k.launch.threads)
    per = arch.regs_per_sm // (max(1, k.launch.min_blocks_per_sm) * threads)
    return max(0, min(arch.max_regs_per_thread, per) // 8 * 8)


def covered_warps(k: Kernel) -> set:
    out: set = set()
    for r in k.roles:
        out |= set(range(r.first_warp, r.first_warp + r.num_warps))
    return out


def block_regs_setmaxnreg(k: Kernel, arch) -> int:
    """Registers a block holds when roles set their budgets (roles without `regs` and idle warps
    keep the launch count)."""
    r0 = launch_regs(k, arch)
    total = sum((r.regs if r.regs is not None else r0) * r.threads for r in k.roles)
    idle = max(0, k.launch.threads // 32 - len(covered_warps(k) & set(range(k.launch.threads // 32))))
    return total + idle * 32 * r0


def occupancy(k: Kernel, arch) -> tuple[int, str, dict]:
    """(blocks per SM, limiting resource, {resource: blocks}) for the kernel as written."""
    threads = max(1, k.launch.threads)
    limits: dict = {"threads": arch.max_threads_per_sm // threads, "blocks": arch.max_blocks_per_sm}
    try:
        smem = plan_smem(k).total
    except Exception:  # noqa: BLE001 - a broken plan is E-RES-01's business
        smem = 0
    if smem:
        limits["shared memory"] = arch.smem_per_sm // (smem + RESERVED_SMEM_PER_BLOCK)
    if any(r.regs is not None for r in k.roles) and "setmaxnreg" in arch.features:
        per_block = block_regs_setmaxnreg(k, arch)
    else:
        need = 0
        for ri, r in enumerate(k.roles):
            need = max(need, role_tile_regs(k, ri)[0] + REG_OVERHEAD)
        per_block = round_up(max(need, 32), 8) * threads
    limits["registers"] = arch.regs_per_sm // per_block if per_block else arch.max_blocks_per_sm
    which = min(limits, key=lambda n: limits[n])
    return max(0, limits[which]), which, limits


def constant_grid(k: Kernel) -> Optional[int]:
    total = 1
    for g in k.launch.grid:
        try:
            v = E.try_const(E.parse_index(g), k.consts)
        except (E.ExprError, RecursionError):
            return None
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return None
        total *= v
    return total
