"""Shared plumbing for the synchronisation rules (E-SYN-*, E-PIP-*): the analysis itself lives in
cake_ir.analysis.sync; this module turns its findings into diagnostics and keeps rules from raising."""
from __future__ import annotations

import functools

from cake_ir.analysis import sync


def safe(check):
    """Rules must never raise: a bug in the analysis turns into a W-VERIFY-SKIPPED warning that says
    which check did not run (CAKE_STRICT=1 re-raises, for tests)."""

    @functools.wraps(check)
    def wrapper(ctx):
        try:
            out = list(check(ctx) or ())
        except Exception as e:  # noqa: BLE001
            if sync.STRICT:
                raise
            code = ctx.rule.code if ctx.rule is not None else "?"
            yield ctx.report("/", f"{code} could not analyse this kernel ({type(e).__name__}: {str(e)[:200]}); "
                                  "its check was skipped", severity="warning", code="W-VERIFY-SKIPPED")
            return
        yield from out

    return wrapper


def sim_issues(ctx, code):
    ks = sync.get(ctx.kernel)
    res = ks.sim()
    if res is None:
        return
    for i in res.of(code):
        yield ctx.report(i.node, i.message, legal=i.legal, fix=i.fix, related=i.related)


def barrier_path(kernel, name):
    for i, b in enumerate(kernel.barriers):
        if b.name == name:
            return f"/barriers/{i}"
    return None


def in_source(ctx, path: str) -> bool:
    """Does `path` name the same node in the source document (not a node the passes generated)?"""
    from cake_ir.walk import resolve
    a, b = resolve(ctx.source, path), resolve(ctx.kernel, path)
    if a is None or b is None:
        return False
    if hasattr(a, "name") and hasattr(b, "name"):
        return a.name == b.name
    return type(a) is type(b)


def barrier_in_source(ctx, bi: int) -> bool:
    """Is /barriers/bi a declaration the author wrote (not one generated from a pipeline)?"""
    src = ctx.source.barriers
    return bi < len(src) and src[bi].name == ctx.kernel.barriers[bi].name
