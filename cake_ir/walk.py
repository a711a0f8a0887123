"""Walking a kernel's statements with their JSON-pointer paths and context.

Rules and passes share this walker so every diagnostic names the same paths the JSON document has.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

from .nodes import Block, For, If, Kernel, LastCta, Let, Role


@dataclass(frozen=True)
class Guard:
    cond: object  # bool | str, the If's condition
    taken: bool   # True in `then`, False in `else`
    path: str


@dataclass(frozen=True)
class Site:
    """Where a statement sits: its path, the role executing it (None = prologue), enclosing loops,
    guards and lets (outermost first)."""

    path: str
    node: object
    role: Optional[Role]
    role_index: Optional[int]
    loops: tuple[For, ...] = ()
    loop_paths: tuple[str, ...] = ()
    guards: tuple[Guard, ...] = ()
    lets: tuple[Let, ...] = ()
    origin: Optional[str] = None  # path of the sugar node this statement was expanded from


def _walk_body(body, path, role, ri, loops, lpaths, guards, lets, origin) -> Iterator[Site]:
    lets = list(lets)
    for i, st in enumerate(body):
        p = f"{path}/{i}"
        yield Site(p, st, role, ri, loops, lpaths, guards, tuple(lets), origin)
        if isinstance(st, Let):
            lets.append(st)
        elif isinstance(st, For):
            yield from _walk_body(st.body, p + "/body", role, ri, loops + (st,), lpaths + (p,), guards,
                                  tuple(lets), origin)
        elif isinstance(st, If):
            yield from _walk_body(st.then, p + "/then", role, ri, loops, lpaths,
                                  guards + (Guard(st.cond, True, p),), tuple(lets), origin)
            yield from _walk_body(st.else_, p + "/else", role, ri, loops, lpaths,
                                  guards + (Guard(st.cond, False, p),), tuple(lets), origin)
        elif isinstance(st, Block):
            yield from _walk_body(st.body, p + "/body", role, ri, loops, lpaths, guards, tuple(lets),
                                  origin or st.origin)
        elif isinstance(st, LastCta):  # CTA-uniform: runs in one CTA of the grid, all of its threads
            yield from _walk_body(st.body, p + "/body", role, ri, loops, lpaths, guards, tuple(lets), origin)


def statements(kernel: Kernel) -> Iterator[Site]:
    """Every statement of the prologue and of each role, in program order, depth first."""
    yield from _walk_body(kernel.prologue, "/prologue", None, None, (), (), (), (), None)
    for ri, role in enumerate(kernel.roles):
        yield from _walk_body(role.body, f"/roles/{ri}/body", role, ri, (), (), (), (), None)


def role_statements(kernel: Kernel, ri: int) -> Iterator[Site]:
    role = kernel.roles[ri]
    yield from _walk_body(role.body, f"/roles/{ri}/body", role, ri, (), (), (), (), None)


def program_path(i: int, path: Optional[str]) -> Optional[str]:
    """A path in kernel i of a Program: the kernel's own path under `/kernels/{i}` (None stays None)."""
    if path is None:
        return None
    return f"/kernels/{i}" + ("" if path in ("", "/") else path)


def resolve(doc, path: str):
    """Follow a JSON pointer into a model or plain JSON; returns None if it does not resolve."""
    cur = doc
    if path in ("", "/"):
        return cur
    for part in path.lstrip("/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(cur, list):
            try:
                cur = cur[int(part)]
            except (ValueError, IndexError):
                return None
        elif isinstance(cur, dict):
            if part not in cur:
                return None
            cur = cur[part]
        else:
            attr = "else_" if part == "else" else part
            if not hasattr(cur, attr):
                return None
            cur = getattr(cur, attr)
    return cur


def path_of(kernel: Kernel, target) -> Optional[str]:
    for s in statements(kernel):
        if s.node is target:
            return s.path
    return None
