"""The verifier engine: loads rule plugins and runs every one, collecting all diagnostics.

A rule is a module with:
    CODE = "E-SYN-03"          stable code; the letter is the default severity (E/W/N)
    TITLE = "..."              one line for the catalog
    STAGE = "expanded"         "source" (the IR as written), "expanded" (after passes.expand), or
                               "program" (a Program's cross-kernel checks; ctx is a ProgramContext)
    def check(ctx): yield ctx.report(path, message, legal=..., fix=[...], related=[...])

`verify(program)` runs every kernel rule on each of a Program's kernels (their diagnostics' node paths
prefixed with `/kernels/{i}`, so they point into the program document), then the "program" rules.
Kernel verification never runs the "program" rules.

Rules load from the `rules/` package (one module per code; never from `rules/proposed/`) and from
installed packages' `cake.rules` entry points. A rule that raises becomes an E-VERIFY-INTERNAL
diagnostic: the verifier itself never raises on any kernel.
"""
from __future__ import annotations

import importlib
import pkgutil
import time
import traceback
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Iterable, Optional, Union

from . import arch as _arch
from .diagnostics import Diagnostic, sort_key
from .nodes import Kernel, Program
from .walk import Site, program_path, resolve, statements

SEVERITY = {"E": "error", "W": "warning", "N": "note"}


@dataclass
class Rule:
    code: str
    title: str
    stage: str
    check: Callable
    module: str

    @property
    def severity(self) -> str:
        return SEVERITY.get(self.code[:1], "error")

    @property
    def family(self) -> str:
        return self.code.split("-")[1] if self.code.count("-") >= 2 else "?"


def _rule_from_module(mod: ModuleType) -> Optional[Rule]:
    code = getattr(mod, "CODE", None)
    check = getattr(mod, "check", None)
    if not code or not callable(check):
        return None
    return Rule(code, getattr(mod, "TITLE", ""), getattr(mod, "STAGE", "expanded"), check, mod.__name__)


_CACHE: dict[str, list[Rule]] = {}


def load_rules(package: str = "rules", entry_points: bool = True) -> list[Rule]:
    """Discover rule modules; `rules.proposed` and private modules are never imported."""
    if package in _CACHE:
        return _CACHE[package]
    found: list[Rule] = []
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.ispkg or info.name.startswith("_"):
            continue  # skips rules/proposed (a package) and helpers like rules/_util.py
        r = _rule_from_module(importlib.import_module(f"{package}.{info.name}"))
        if r:
            found.append(r)
    if entry_points:
        from importlib.metadata import entry_points as eps
        for ep in eps(group="cake.rules"):
            try:
                r = _rule_from_module(ep.load())
            except Exception:  # a broken third-party plugin must not break verification
                continue
            if r:
                found.append(r)
    codes = [r.code for r in found]
    dup = {c for c in codes if codes.count(c) > 1}
    if dup:
        raise RuntimeError(f"duplicate rule codes: {sorted(dup)}")
    found.sort(key=lambda r: r.code)
    _CACHE[package] = found
    return found


class Context:
    """What a rule sees: the kernel (expanded or source), the arch spec, facts, and a reporter."""

    def __init__(self, kernel: Kernel, source: Kernel, rule: Optional[Rule] = None,
                 shared: Optional[dict] = None, program: Optional[Program] = None):
        self.kernel = kernel
        self.source = source
        self.rule = rule
        self.program = program   # the Program the kernel is verified as part of (None: a lone kernel)
        self.arch = _arch.spec(kernel.arch)
        # analyses of `kernel` every rule reads (sites, facts): one verify run computes them once and
        # hands the same dict to each rule's context
        self._shared = {} if shared is None else shared

    @property
    def sites(self) -> list[Site]:
        if "sites" not in self._shared:
            self._shared["sites"] = list(statements(self.kernel))
        return self._shared["sites"]

    @property
    def base_env(self):
        from .analysis.facts import kernel_env
        if "base_env" not in self._shared:
            self._shared["base_env"] = kernel_env(self.kernel)
        return self._shared["base_env"]

    def env(self, site: Site):
        """The facts at `site`: computed once per (role, loops, lets in view), since the sites of one
        scope share them, and copied (a rule may add names)."""
        from .analysis.facts import site_env
        key = (site.role_index, tuple(map(id, site.loops)), tuple(map(id, site.lets)))
        cache = self._shared.setdefault("envs", {})
        env = cache.get(key)
        if env is None:
            env = cache[key] = site_env(self.kernel, site, self.base_env)
        return dict(env)

    def report(self, node: str, message: str, *, legal=None, fix=None, related=(), severity=None,
               code=None, origin=None) -> Diagnostic:
        return _diagnostic(self.kernel, code or self.rule.code, node, message, legal, fix, related, severity,
                           origin)


def _diagnostic(root, code: str, node: str, message: str, legal, fix, related, severity,
                origin=None) -> Diagnostic:
    """A rule's diagnostic at `node` of `root` (a Kernel, or a Program for program rules), with the
    node's author id and the code's default severity."""
    target = resolve(root, node)
    return Diagnostic(code=code, severity=severity or SEVERITY.get(code[:1], "error"), node=node,
                      node_id=getattr(target, "id", None) if target is not None else None,
                      related=list(related), message=message, legal=legal, fix=fix, origin=origin)


@dataclass
class VerifyResult:
    kernel: Optional[Kernel]          # the source kernel
    expanded: Optional[Kernel]        # after passes.expand (what lowering consumes)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(d.severity == "error" for d in self.diagnostics)


class ProgramContext:
    """What a "program" rule sees: the whole Program and a reporter (paths are program paths)."""

    def __init__(self, program: Program, rule: Optional[Rule] = None):
        self.program = program
        self.rule = rule

    def report(self, node: str, message: str, *, legal=None, fix=None, related=(), severity=None,
               code=None) -> Diagnostic:
        return _diagnostic(self.program, code or self.rule.code, node, message, legal, fix, related, severity)


@dataclass
class ProgramVerifyResult:
    """verify(program): the same `ok` / `diagnostics` surface as VerifyResult, plus each kernel's own
    result (its diagnostics with kernel-relative paths) and expanded form."""
    program: Program
    kernels: list[VerifyResult] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)   # program paths (/kernels/i/...)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(d.severity == "error" for d in self.diagnostics)

    @property
    def expanded(self) -> list[Optional[Kernel]]:
        return [r.expanded for r in self.kernels]


def prefix_diagnostic(d: Diagnostic, i: int) -> Diagnostic:
    """Kernel i's diagnostic re-pointed into its program document: node, related paths, origin and
    JSON-patch paths under `/kernels/{i}`."""
    def p(path):
        return program_path(i, path) if isinstance(path, str) else path
    fix = [{k: (p(v) if k in ("path", "from") else v) for k, v in op.items()} for op in d.fix] if d.fix else d.fix
    return d.model_copy(update={"node": p(d.node), "related": [p(r) for r in d.related],
                                "origin": p(d.origin) if d.origin else d.origin, "fix": fix})


def verify(kernel: Union[Kernel, Program], rules: Optional[Iterable[Rule]] = None):
    """VerifyResult for a Kernel, ProgramVerifyResult for a Program."""
    if isinstance(kernel, Program):
        return verify_program(kernel, rules)
    return _verify_kernel(kernel, [r for r in (list(rules) if rules is not None else load_rules())
                                   if r.stage != "program"])


def verify_program(program: Program, rules: Optional[Iterable[Rule]] = None) -> ProgramVerifyResult:
    t0 = time.perf_counter()
    rules = list(rules) if rules is not None else load_rules()
    kernel_rules = [r for r in rules if r.stage != "program"]
    out = ProgramVerifyResult(program)
    diags: list[Diagnostic] = []
    for i, k in enumerate(program.kernels):
        res = _verify_kernel(k, kernel_rules, program)
        out.kernels.append(res)
        diags.extend(prefix_diagnostic(d, i) for d in res.diagnostics)
    for rule in (r for r in rules if r.stage == "program"):
        ctx = ProgramContext(program, rule)
        try:
            diags.extend(rule.check(ctx) or ())
        except Exception as e:  # noqa: BLE001 - a broken rule is a diagnostic, not a crash
            diags.append(_internal(rule, e))
    out.diagnostics = _dedup(diags)
    out.seconds = time.perf_counter() - t0
    return out


def _internal(rule: Rule, e: Exception) -> Diagnostic:
    tb = traceback.extract_tb(e.__traceback__)[-1]
    return Diagnostic(code="E-VERIFY-INTERNAL", node="/", message=(
        f"rule {rule.code} raised {type(e).__name__}: {e} ({tb.filename.rsplit('/', 1)[-1]}:{tb.lineno})")[:500])


def _dedup(diags: list[Diagnostic]) -> list[Diagnostic]:
    """Deduplicate (same code, node and message) and order errors first."""
    seen, out = set(), []
    for d in sorted(diags, key=sort_key):
        key = (d.code, d.node, d.message)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def _verify_kernel(kernel: Kernel, rules: list[Rule], program: Optional[Program] = None) -> VerifyResult:
    from .passes import expand

    t0 = time.perf_counter()
    diags: list[Diagnostic] = []
    expanded, pass_diags = expand(kernel)
    diags.extend(pass_diags)
    shared: dict[int, dict] = {}          # per target kernel (source or expanded): Context._shared
    for rule in rules:
        target = kernel if rule.stage == "source" or expanded is None else expanded
        ctx = Context(target, kernel, rule, shared.setdefault(id(target), {}), program)
        try:
            for d in rule.check(ctx) or ():
                if d.origin is None:
                    d.origin = _origin_of(ctx, d.node)
                diags.append(d)
        except Exception as e:  # noqa: BLE001 - a broken rule is a diagnostic, not a crash
            diags.append(_internal(rule, e))
    return VerifyResult(kernel, expanded, _dedup(diags), time.perf_counter() - t0)


def _origin_of(ctx: Context, path: str) -> Optional[str]:
    for s in ctx.sites:
        if s.path == path:
            return s.origin
    return None


def verify_document(source):
    """Load (text, bytes or dict) then verify; schema problems come back as diagnostics."""
    from .io import load

    kernel, diags = load(source)
    if kernel is None:
        return VerifyResult(None, None, diags)
    return verify(kernel)
