"""Facts about index variables at a statement: builtins, consts, params, loop variables, lets.

Builtin index variables (the same names the lowering defines):
  bid.x bid.y bid.z   block index        nbid.x nbid.y nbid.z  grid size
  tid                 thread in CTA      lane                  thread in warp
  warp                warp in CTA        role_warp, role_tid   warp / thread within the role
  wg                  warpgroup in role  wg_tid                thread within the warpgroup
"""
from __future__ import annotations

from typing import Optional

from .. import expr as E
from ..nodes import Kernel, Role, ScalarParam, TensorParam
from ..walk import Site

BUILTINS = ("bid.x", "bid.y", "bid.z", "nbid.x", "nbid.y", "nbid.z", "tid", "lane", "warp", "role_warp",
            "role_tid", "wg", "wg_tid")


def kernel_env(k: Kernel) -> dict[str, E.Fact]:
    env: dict[str, E.Fact] = {}
    for name, v in k.consts.items():
        env[name] = E.Fact.const(v)
    for p in k.params:
        if isinstance(p, ScalarParam) and p.dtype != "f32":
            lo = p.min if p.min is not None else (0 if p.dtype == "u32" else -E.INF)
            hi = p.max if p.max is not None else E.INF
            env[p.name] = E.Fact(lo, hi, p.divisible_by)
    grid = list(k.launch.grid) + [1] * (3 - len(k.launch.grid))
    for axis, g in zip("xyz", grid):
        gf = E.facts(E.parse_index(g), env) if _parses(g) else E.Fact(1, E.INF, 1)
        gf = E.Fact(max(1, gf.lo), gf.hi, gf.div)
        env[f"nbid.{axis}"] = gf
        env[f"bid.{axis}"] = E.Fact(0, gf.hi - 1, 1)
    t = k.launch.threads
    env["tid"] = E.Fact(0, t - 1, 1)
    env["lane"] = E.Fact(0, 31, 1)
    env["warp"] = E.Fact(0, max(0, (t - 1) // 32), 1)
    return env


def _parses(e) -> bool:
    try:
        E.parse_index(e)
        return True
    except E.ExprError:
        return False


def role_env(k: Kernel, role: Optional[Role], base: Optional[dict] = None) -> dict[str, E.Fact]:
    env = dict(base if base is not None else kernel_env(k))
    if role is not None:
        env["role_warp"] = E.Fact(0, role.num_warps - 1, 1)
        env["role_tid"] = E.Fact(0, role.threads - 1, 1)
        env["wg"] = E.Fact(0, max(0, role.num_warps // 4 - 1) if role.num_warps >= 4 else 0, 1)
        env["wg_tid"] = E.Fact(0, min(128, role.threads) - 1, 1)
        env["warp"] = E.Fact(role.first_warp, role.first_warp + role.num_warps - 1, 1)
    else:
        env["role_warp"] = env["warp"]
        env["role_tid"] = env["tid"]
        env["wg"] = E.Fact(0, env["warp"].hi // 4, 1)
        env["wg_tid"] = E.Fact(0, 127, 1)
    return env


def site_env(k: Kernel, site: Site, base: Optional[dict] = None) -> dict[str, E.Fact]:
    env = role_env(k, site.role, base)
    # Loops and lets are interleaved in program order; lets see enclosing loop vars.
    for loop in site.loops:
        env[loop.var] = loop_fact(loop, env)
    for let in site.lets:
        try:
            env[let.name] = E.facts(E.parse_index(let.value), env)
        except E.ExprError:
            env[let.name] = E.Fact()
    return env


def loop_fact(loop, env) -> E.Fact:
    try:
        s = E.facts(E.parse_index(loop.start), env)
        t = E.facts(E.parse_index(loop.stop), env)
    except E.ExprError:
        return E.Fact()
    div = s.div if s.div == 0 or loop.step == 1 else E._gcd(s.div, loop.step) if s.div else loop.step
    if loop.step > 1 and s.div == 0:
        div = loop.step
    return E.Fact(s.lo, t.hi - 1, div if div else 1)


def fact(k: Kernel, site: Site, expr_text, base=None) -> E.Fact:
    return E.facts(E.parse_index(expr_text), site_env(k, site, base))


def trip_count(loop, env) -> Optional[int]:
    """Static trip count of a loop when start and stop are constants, else None."""
    s = E.try_const(E.parse_index(loop.start), {n: int(f.lo) for n, f in env.items() if f.lo == f.hi})
    t = E.try_const(E.parse_index(loop.stop), {n: int(f.lo) for n, f in env.items() if f.lo == f.hi})
    if isinstance(s, int) and isinstance(t, int):
        return max(0, -(-(t - s) // loop.step))
    return None


def tensor_params(k: Kernel) -> dict[str, TensorParam]:
    return {p.name: p for p in k.params if isinstance(p, TensorParam)}
