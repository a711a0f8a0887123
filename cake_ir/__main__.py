"""Command line: `python -m cake_ir COMMAND ...`

    verify FILE... [--json]                       run every verifier rule
    compile FILE [--arch A] [--emit cuda|cubin] [-o OUT] [--json] [--no-cache]
    print FILE [--expanded] [--verify]            the IR as text, one node per line with its path
    cost FILE [--shape M=8192 ...] [--gpu NAME] [--json] [--no-verify] [--sass]
    sass FILE [--arch A] [--top N] [--json]      static SASS instructions per IR node (needs nvdisasm)
    schema [--program]                            the Kernel (or Program) JSON schema
    rules [--markdown | --json]                   the rule catalog (--markdown: docs/diagnostics.md)

Every FILE may hold a Kernel or a Program (a document with "kernels"): node paths then start with
/kernels/{i}; `compile` writes one cubin per kernel (STEM.KERNEL.cubin), `sass` and `cost` sum over
the kernels.

Exit status: 0 clean (warnings allowed), 1 diagnostics with errors, 2 unusable input (missing file,
malformed JSON, schema violation, bad arguments), 3 an internal failure of the tool itself.
Only argparse/json/pathlib/sys/os load at start; each command imports what it needs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EXIT_OK, EXIT_DIAG, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


class _Fail(Exception):
    """Stop a command with an exit status after its message was printed."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def _err(msg: str) -> None:
    print(msg, file=sys.stderr)


# ----------------------------------------------------------------------------------- loading
def _read(path: str):
    """(kernel | None, load diagnostics, raw text | None). Never raises."""
    from .diagnostics import Diagnostic
    from .io import MAX_DOC_BYTES, load

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_DOC_BYTES + 1)
    except OSError as e:
        return None, [Diagnostic(code="E-PARSE-FILE", node="/", message=f"cannot read {path}: {e.strerror}")], None
    kernel, diags = load(data)
    try:
        text = data.decode("utf-8", errors="replace")
    except Exception:  # noqa: BLE001
        text = None
    return kernel, diags, text


def _json_value_at(text: str, pointer: str):
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None, False
    if pointer in ("", "/"):
        return None, False
    cur = doc
    for part in pointer.lstrip("/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(cur, list):
            try:
                cur = cur[int(part)]
            except (ValueError, IndexError):
                return None, False
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return None, False
    return cur, True


def _show_load_failure(path: str, diags, text) -> str:
    """Parse/schema problems: the message with its location, plus the JSON line or value."""
    import re

    out = []
    for d in diags:
        out.append(f"{path}: {d.short()}")
        m = re.search(r"line (\d+), column (\d+)", d.message)
        if d.code == "E-PARSE-JSON" and m and text is not None:
            ln, col = int(m.group(1)), int(m.group(2))
            lines = text.splitlines() or [""]
            if 1 <= ln <= len(lines):
                src = lines[ln - 1]
                start = max(0, col - 60)
                snippet = src[start:start + 100]
                out.append(f"  {ln:>5} | {snippet}")
                out.append(f"  {'':>5} | {' ' * (col - 1 - start)}^")
        elif d.code.startswith("E-SCHEMA") and text is not None:
            val, found = _json_value_at(text, d.node)
            if found:
                s = json.dumps(val)
                out.append(f"        value at {d.node}: {s if len(s) <= 120 else s[:117] + '...'}")
    return "\n".join(out)


def _load_or_fail(path: str, as_json: bool, json_object: bool = False):
    kernel, diags, text = _read(path)
    if kernel is None:
        if as_json:
            listed = [dict(_ddict(d), file=path) for d in diags]
            print(json.dumps({"ok": False, "file": path, "diagnostics": listed} if json_object else listed, indent=2))
        else:
            _err(_show_load_failure(path, diags, text))
        raise _Fail(EXIT_INPUT)
    return kernel


def _ddict(d) -> dict:
    return d.model_dump(exclude_none=True)


def _show_diags(kernel, diags, header: str = "") -> str:
    """Each diagnostic on a line, then the IR re-printed around the offending nodes."""
    from .diagnostics import sort_key
    from .printer import diagnostic_marks, format_excerpt

    diags = sorted(diags, key=sort_key)
    out = [header] if header else []
    for d in diags:
        line = d.short()
        if d.origin:
            line += f"  (expanded from {d.origin})"
        out.append(line)
        if d.fix:
            out.append(f"    fix: {json.dumps(d.fix)}")
        if d.related:
            out.append(f"    related: {', '.join(d.related)}")
    if diags and kernel is not None:
        out.append("")
        out.append(format_excerpt(kernel, diagnostic_marks(diags)).rstrip("\n"))
    return "\n".join(out)


def _count(diags) -> str:
    e = sum(d.severity == "error" for d in diags)
    w = sum(d.severity == "warning" for d in diags)
    n = len(diags) - e - w
    parts = [f"{e} error(s)", f"{w} warning(s)"] + ([f"{n} note(s)"] if n else [])
    return ", ".join(parts)


def _verify(kernel):
    from .verifier import verify

    try:
        return verify(kernel)
    except Exception as e:  # noqa: BLE001 - e.g. a rule module that fails to import
        _internal("verifier failed", e)


def _internal(what: str, e: BaseException):
    _err(f"internal error: {what}: {type(e).__name__}: {e}")
    if os.environ.get("CAKE_DEBUG"):
        import traceback
        traceback.print_exception(e)
    raise _Fail(EXIT_INTERNAL)


# ---------------------------------------------------------------------------------- commands
def cmd_verify(args) -> int:
    status = EXIT_OK
    collected = []
    for path in args.files:
        kernel, diags, text = _read(path)
        if kernel is None:
            status = EXIT_INPUT
            collected.extend(dict(_ddict(d), file=path) for d in diags)
            if not args.json:
                _err(_show_load_failure(path, diags, text))
            continue
        res = _verify(kernel)
        collected.extend(dict(_ddict(d), file=path) for d in res.diagnostics)
        if not res.ok and status == EXIT_OK:
            status = EXIT_DIAG
        if not args.json:
            if res.diagnostics:
                print(_show_diags(kernel, res.diagnostics, f"{path}: {_count(res.diagnostics)}"))
            else:
                print(f"{path}: ok ({res.seconds * 1e3:.0f} ms)")
    if args.json:
        print(json.dumps(collected, indent=2))
    return status


def cmd_compile(args) -> int:
    from .nodes import Program
    kernel = _load_or_fail(args.file, args.json, json_object=True)
    if args.arch:
        from .arch import ARCHES
        if args.arch not in ARCHES:
            _err(f"unknown --arch {args.arch!r}; one of {', '.join(ARCHES)}")
            return EXIT_INPUT
    try:
        from .compiler import compile_ir, compiled_parts
        res = compile_ir(kernel, arch=args.arch, emit=args.emit, use_cache=not args.no_cache)
    except ImportError as e:
        _internal("the lowering is not available", e)
    except Exception as e:  # noqa: BLE001 - compile_kernel should report, never raise
        _internal("compile raised", e)
    program = isinstance(kernel, Program)
    parts = compiled_parts(res)
    outputs, source = [], None
    if res.ok:
        if args.emit == "cuda":        # a Program: its kernels' sources one after another
            source = ("".join(f"// ---- /kernels/{i}: {k.name}\n{r.cuda_source or ''}\n"
                              for i, (k, r) in enumerate(zip(kernel.kernels, parts)))
                      if program else res.cuda_source or "")
            if args.output:
                outputs.append(args.output)
                Path(args.output).write_text(source)
            elif not args.json:
                sys.stdout.write(source)
        else:                          # a Program: one STEM.KERNEL.cubin per kernel
            stem = args.output.removesuffix(".cubin") if args.output else Path(args.file).stem
            names = [f"{stem}.{k.name}.cubin" for k in kernel.kernels] if program else [
                args.output or stem + ".cubin"]
            for out, r in zip(names, parts):
                outputs.append(out)
                Path(out).write_bytes(r.cubin or b"")
    if args.json:
        doc = {"ok": res.ok, "file": args.file, "arch": res.arch, "emit": args.emit, "cached": res.cached,
               "seconds": res.seconds, "diagnostics": [_ddict(d) for d in res.diagnostics]}
        about = [{"kernel_name": r.kernel_name, "smem_bytes": r.smem_bytes, "resources": r.resources,
                  "signature": r.signature} for r in parts]
        if program:
            doc.update(outputs=outputs, kernels=about)
        else:
            doc.update(output=outputs[0] if outputs else None, **about[0])
        if source is not None and not args.output:
            doc["cuda_source"] = source
        print(json.dumps(doc, indent=2, default=str))
    else:
        report = sys.stderr if (source is not None and not args.output) else sys.stdout
        if res.diagnostics:
            print(_show_diags(kernel, res.diagnostics, f"{args.file}: {_count(res.diagnostics)}"), file=report)
        for out, r in zip(outputs, parts):
            extra = "; " + ", ".join(f"{k} {v}" for k, v in r.resources.items()) if r.resources else ""
            print(f"{args.file}: wrote {out} ({res.arch}, kernel {r.kernel_name}, smem {r.smem_bytes} B{extra})",
                  file=report)
    return EXIT_OK if res.ok else EXIT_DIAG


def cmd_print(args) -> int:
    from .printer import diagnostic_marks, format_kernel

    kernel = _load_or_fail(args.file, False)
    status = EXIT_OK
    mark = None
    if args.verify:
        res = _verify(kernel)
        mark = diagnostic_marks(res.diagnostics)
        status = EXIT_OK if res.ok else EXIT_DIAG
    shown = kernel
    if args.expanded:
        from .nodes import Program
        from .passes import expand
        try:
            if isinstance(kernel, Program):   # each kernel expanded in place
                shown = kernel.model_copy(update={"kernels": [expand(k)[0] or k for k in kernel.kernels]})
            else:
                shown, _ = expand(kernel)
        except Exception as e:  # noqa: BLE001
            _internal("expansion failed", e)
    sys.stdout.write(format_kernel(shown, mark))
    return status


def _parse_shapes(items) -> dict:
    shapes = {}
    for item in items or []:
        name, sep, val = item.partition("=")
        name, val = name.strip(), val.strip().replace("_", "")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = int(val, 0)
        except ValueError:
            _err(f"--shape {item!r}: expected NAME=INTEGER (e.g. --shape M=8192)")
            raise _Fail(EXIT_INPUT) from None
    return shapes


def cmd_cost(args) -> int:
    kernel = _load_or_fail(args.file, args.json)
    shapes = _parse_shapes(args.shape)
    diags = []
    if not args.no_verify:
        res = _verify(kernel)
        diags = res.diagnostics
        if not res.ok:
            if args.json:
                print(json.dumps([dict(_ddict(d), file=args.file) for d in diags], indent=2))
            else:
                print(_show_diags(kernel, diags, f"{args.file}: {_count(diags)} (not costed; --no-verify to force)"))
            return EXIT_DIAG
    from . import cost as _cost

    constants = None
    if args.gpu:
        try:
            constants = _cost.load_constants(args.gpu)
        except (ValueError, OSError) as e:
            _err(f"--gpu {args.gpu}: {e}")
            return EXIT_INPUT
        if not Path(args.gpu).is_file() and not (_cost.CALIBRATION_DIR / f"{args.gpu.lower()}.json").is_file():
            _err(f"note: no calibration data for {args.gpu!r}; using the {constants.name} table defaults")
    sass = None
    if args.sass:
        from .analysis.sass import sass_profile
        try:
            sass = {n.path: n.count for n in sass_profile(kernel).nodes}
        except RuntimeError as e:       # no nvdisasm, or the kernel does not lower
            _err(f"--sass: {e}")
            return EXIT_INPUT
    try:
        rep = _cost.estimate(kernel, shapes, constants, sass=sass)
    except Exception as e:  # noqa: BLE001
        _internal("cost model raised", e)
    if args.json:
        doc = rep.to_dict()
        doc["diagnostics"] = [_ddict(d) for d in diags]
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(rep.summary())
        if diags:
            print(_show_diags(kernel, diags, f"{args.file}: {_count(diags)}"))
    return EXIT_OK


def cmd_sass(args) -> int:
    from .compiler import with_arch
    kernel = _load_or_fail(args.file, args.json)
    res = _verify(with_arch(kernel, args.arch))
    if not res.ok:
        print(_show_diags(kernel, res.diagnostics, f"{args.file}: {_count(res.diagnostics)} (not compiled)"))
        return EXIT_DIAG
    from .analysis.sass import sass_profile
    try:
        prof = sass_profile(kernel, args.arch)
    except RuntimeError as e:       # no nvdisasm, or the kernel does not lower
        _err(f"{args.file}: {e}")
        return EXIT_INPUT
    except Exception as e:  # noqa: BLE001
        _internal("SASS attribution failed", e)
    print(json.dumps(prof.to_dict(), indent=2) if args.json else prof.table(args.top))
    return EXIT_OK


def cmd_schema(args) -> int:
    from .io import json_schema

    print(json.dumps(json_schema(program=args.program), indent=2))
    return EXIT_OK


# ------------------------------------------------------------------------------------- rules
_OTHER_CODES = [
    ("E-PARSE-FILE", "error", "the file cannot be read"),
    ("E-PARSE-SIZE", "error", "the document is larger than the loader's limit (8 MiB)"),
    ("E-PARSE-JSON", "error", "malformed JSON; the message gives line and column"),
    ("E-PARSE-DEPTH", "error", "the document nests deeper than the loader's limit"),
    ("E-SCHEMA-MISSING", "error", "a required field is missing (the node path names the field)"),
    ("E-SCHEMA-EXTRA", "error", "a field the schema does not have"),
    ("E-SCHEMA-TAG", "error", "an unknown `op` / `kind` discriminator"),
    ("E-SCHEMA-VALUE", "error", "a value outside a field's legal set (`legal` lists them)"),
    ("E-SCHEMA-TYPE", "error", "a value of the wrong type, or an invalid identifier / expression"),
    ("E-VERIFY-INTERNAL", "error", "a verifier rule raised; the message names the rule, file and line"),
    ("W-VERIFY-SKIPPED", "warning", "a rule's analysis could not handle this kernel; that check did not run"),
    ("E-LOWER-UNSUPPORTED", "error", "the lowering has no rule for this construct yet (the node path names it)"),
    ("E-PASS-EXPAND", "error", "pipeline sugar could not be expanded into valid nodes (it stays unexpanded)"),
    ("E-LOWER-EXPR", "error", "an expression could not be rendered as C"),
    ("E-BACKEND-COMPILE", "error", "NVRTC front-end errors, mapped to node paths via the line map"),
    ("E-BACKEND-PTXAS", "error", "ptxas errors, mapped to node paths through a -lineinfo PTX compile"),
    ("W-BACKEND-SPILL", "warning", "ptxas spilled registers (bytes stored/loaded in the message)"),
    ("W-BACKEND-LOCAL", "warning", "the kernel uses local memory (a register array indexed at run time?)"),
    ("W-BACKEND-SETMAXNREG", "warning", "ptxas ignored setmaxnreg (warning C7508)"),
    ("W-BACKEND-WGMMA-SERIAL", "warning", "ptxas serialized the kernel's wgmma (info C7514 and kin: the reason in the message)"),
    ("W-BACKEND-WARNING", "warning", "another NVRTC/ptxas warning"),
    ("N-BACKEND-RESOURCES", "note", "ptxas's resource report: registers, stack, spills, static shared memory"),
]


def _doc_paragraph(rule) -> str:
    """The first paragraph of the rule module's docstring without its `CODE:` prefix (the second
    paragraph when the first only repeats the title)."""
    import importlib
    import re

    try:
        mod = sys.modules.get(rule.module) or importlib.import_module(rule.module)
        doc = (mod.__doc__ or "").strip()
    except Exception:  # noqa: BLE001
        doc = ""
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", doc)] if doc else []
    paras = [p for p in paras if p]
    if not paras:
        return ""
    first = re.sub(rf"^{re.escape(rule.code)}\s*[:\-\u2014]\s*", "", paras[0])
    norm = lambda t: re.sub(r"[^a-z0-9]+", " ", t.lower()).strip()  # noqa: E731
    if norm(first) == norm(rule.title) and len(paras) > 1:
        return paras[1]   # the first paragraph only repeats the title: the explanation says more
    return first


def _md_cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def cmd_rules(args) -> int:
    try:
        from .verifier import load_rules
        rules = load_rules()
    except Exception as e:  # noqa: BLE001
        _internal("loading rules failed", e)
    if args.json:
        print(json.dumps([{"code": r.code, "severity": r.severity, "family": r.family, "stage": r.stage,
                           "title": r.title, "module": r.module, "doc": _doc_paragraph(r)} for r in rules], indent=2))
        return EXIT_OK
    if args.markdown:
        out = ["# CAKE IR diagnostics", "",
               "<!-- generated by `python -m cake_ir rules --markdown`; do not edit by hand -->", "",
               "Every verifier rule is a module in `rules/` (or an installed `cake.rules` plugin) with a stable code; "
               "the code's letter is its default severity (E error, W warning, N note). Diagnostics name the "
               "offending node by JSON pointer; `python -m cake_ir verify FILE` re-prints the IR around it.", "",
               f"## Verifier rules ({len(rules)})", "",
               "| code | severity | stage | title | description |", "|---|---|---|---|---|"]
        for r in rules:
            out.append(f"| `{r.code}` | {r.severity} | {r.stage} | {_md_cell(r.title)} | {_md_cell(_doc_paragraph(r))} |")
        out += ["", "## Codes reported outside the rules", "", "| code | severity | meaning |", "|---|---|---|"]
        for code, sev, text in _OTHER_CODES:
            out.append(f"| `{code}` | {sev} | {_md_cell(text)} |")
        print("\n".join(out))
        return EXIT_OK
    width = max((len(r.code) for r in rules), default=8)
    for r in rules:
        print(f"{r.code:<{width}}  {r.severity:<7}  {r.title}")
    print(f"{len(rules)} rule(s)")
    return EXIT_OK


# -------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cake_ir", description="CAKE IR tools.",
                                epilog="exit status: 0 clean, 1 diagnostics with errors, 2 unusable input, "
                                       "3 internal error")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    s = sub.add_parser("verify", help="run the verifier on IR files")
    s.add_argument("files", nargs="+", metavar="FILE")
    s.add_argument("--json", action="store_true", help="diagnostics as a JSON list")
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("compile", help="verify, lower and compile one IR file")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--arch", default=None, help="target arch (default: the kernel's), e.g. sm_90a")
    s.add_argument("--emit", choices=("cuda", "cubin"), default="cubin")
    s.add_argument("-o", "--output", default=None, help="output file (default: stdout for cuda, STEM.cubin)")
    s.add_argument("--json", action="store_true", help="result and diagnostics as JSON")
    s.add_argument("--no-cache", action="store_true", help="bypass the compile cache")
    s.set_defaults(func=cmd_compile)

    s = sub.add_parser("print", help="print the IR as text with node paths")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--expanded", action="store_true", help="print after the expansion passes")
    s.add_argument("--verify", action="store_true", help="mark the verifier's diagnostics")
    s.set_defaults(func=cmd_print)

    s = sub.add_parser("cost", help="analytical cost estimate")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--shape", action="append", metavar="NAME=INT", help="value of a scalar param (repeatable)")
    s.add_argument("--gpu", default=None, help="calibration: a GPU name (calibration/data/NAME.json) or a file")
    s.add_argument("--json", action="store_true", help="the report as JSON")
    s.add_argument("--no-verify", action="store_true", help="cost even if the verifier reports errors")
    s.add_argument("--sass", action="store_true",
                   help="count instructions in the compiled SASS (NVRTC + nvdisasm) instead of modelling them")
    s.set_defaults(func=cmd_cost)

    s = sub.add_parser("sass", help="static SASS instructions per IR node (nvdisasm)")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--arch", default=None, help="target arch (default: the kernel's), e.g. sm_90a")
    s.add_argument("--top", type=int, default=25, help="nodes to list (default 25)")
    s.add_argument("--json", action="store_true", help="every node's counts as JSON")
    s.set_defaults(func=cmd_sass)

    s = sub.add_parser("schema", help="print the Kernel JSON schema")
    s.add_argument("--program", action="store_true", help="the Program schema instead")
    s.set_defaults(func=cmd_schema)

    s = sub.add_parser("rules", help="the verifier rule catalog")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--markdown", action="store_true", help="docs/diagnostics.md")
    g.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_rules)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: 0 for --help, 2 for bad usage
        return int(e.code or 0)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    try:
        return args.func(args)
    except _Fail as f:
        return f.status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
