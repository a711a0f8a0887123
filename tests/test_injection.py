"""Nothing an IR document contains reaches the generated C++ as code except through typed fields.

Hostile text (comment terminators, newlines, preprocessor lines, escapes, line splices, trigraphs,
Unicode lookalikes and line separators) goes into every string field of a kernel that lowers cleanly.
Identifier fields must reject it at load with a schema diagnostic naming the field. Expression fields
either reject it or parse it (the C++ is then rendered from the parsed tree, never from the text).
Notes are free text: they may only show up inside a sanitized `//` comment. Every accepted variant is
lowered (emit="cuda") and the generated part of the source is checked: no preprocessor lines beyond
the baseline's `#pragma`s, no line splices, no block comments, and no payload text outside comments.
"""
import copy
import json
from pathlib import Path

import pytest

from cake_ir.compiler import compile_kernel
from cake_ir.io import load
from cake_ir.lower import header_text

ROOT = Path(__file__).resolve().parent.parent
SEED = json.loads((ROOT / "tasks/softmax/seeds/softmax_row_n4096.json").read_text())

PAYLOADS = [
    "x*/y", "x/*y", "x//y", "x\n#include <stdio.h>", "x\r\n#define M 0", "#define M 0", "x\\\ny", "x\\",
    'x"y', "x\\n", "x??/", "x\u2028#define M 0", "x\u0085y", "x\u0430", "\u0445", "x\u200by", "x\x00y",
    "x\n", "x\t", "x;asm(\"trap;\");", "x) {} void f(", "x\u00a0",
]
EXPR_PAYLOADS = [
    "M */ 1", "M // 2", "M /* 2 */", "M\n#define M 0", "M \\\n+ 1", "M + \u0661", "M\u00a0+ 1", "M; asm(\"trap;\")",
    "M\u2028", "M + \"x\"", "M ??/", "M + 0x1\\", "#M",
]


def _doc():
    d = copy.deepcopy(SEED)
    body = d["roles"][0]["body"]
    body.insert(0, {"op": "if", "cond": "bid.x < M", "then": [{"op": "syncthreads"}]})
    d["barriers"] = [{"kind": "named", "name": "bar0", "bar_id": 1, "threads": 256}]
    return d


def _set(doc, ptr, value):
    *parents, last = [int(t) if t.isdigit() else t for t in ptr.strip("/").split("/")]
    cur = doc
    for t in parents:
        cur = cur[t]
    cur[last] = value


# pointers into _doc(); body/0 is the inserted `if`, body/1 the ldg, body/2 a map
IDENT_FIELDS = ["/name", "/params/0/name", "/params/1/name", "/buffers/0/name", "/buffers/0/role",
                "/barriers/0/name", "/roles/0/name", "/roles/0/id", "/roles/0/body/1/id", "/roles/0/body/1/src/buf",
                "/roles/0/body/2/dst/buf"]
EXPR_FIELDS = ["/launch/grid/0", "/params/1/shape/0", "/roles/0/body/1/src/offset/0", "/roles/0/body/0/cond",
               "/roles/0/body/2/expr"]
NOTE_FIELDS = ["/note", "/roles/0/note", "/buffers/0/note", "/roles/0/body/1/note", "/roles/0/body/0/then/0/note"]

HEADER = header_text()


def _generated(src: str) -> str:
    return src[len(HEADER):] if src.startswith(HEADER) else src


def _code_part(line: str) -> str:
    return line.split("//", 1)[0]


def _compile(doc) -> str:
    kernel, diags = load(doc)
    assert kernel is not None, diags
    # lowered even when verification would stop it (e.g. a name the payload made unknown)
    res = compile_kernel(kernel, emit="cuda", verify_first=False)
    return res.cuda_source or ""


BASELINE = _generated(_compile(_doc()))
BASE_PP = {l.strip() for l in BASELINE.splitlines() if l.lstrip().startswith("#")}


def _check_source(src: str, payload: str) -> None:
    if not src:  # lowering refused with diagnostics: nothing was generated
        return
    def pp(text, word):
        return sum(1 for l in text.splitlines() if l.lstrip().startswith("#") and word in l)
    assert pp(src, "include") == pp(HEADER, "include") and pp(src, "define") == pp(HEADER, "define")
    gen = _generated(src)
    for line in gen.splitlines():
        assert not line.rstrip().endswith("\\"), f"line splice: {line!r}"
        assert "/*" not in line and "*/" not in line, f"block comment: {line!r}"
        assert all(" " <= ch <= "~" for ch in line), f"non-printable / non-ASCII character: {line!r}"
        if line.lstrip().startswith("#"):
            assert line.strip() in BASE_PP, f"new preprocessor line: {line!r}"
    bad = [t for t in ("#include", "#define", "asm(", "??/", "\\") if t in payload]
    for line in gen.splitlines():
        for t in bad:
            assert t not in _code_part(line), f"payload {t!r} reached code: {line!r}"


def test_baseline_lowers_cleanly():
    assert "softmax_row_n4096(" in BASELINE and BASE_PP <= {"#pragma unroll"}


@pytest.mark.parametrize("field", IDENT_FIELDS)
def test_identifier_fields_reject_hostile_text(field):
    for payload in PAYLOADS:
        doc = _doc()
        _set(doc, field, payload)
        kernel, diags = load(doc)
        assert kernel is None, f"{field} accepted {payload!r}"
        assert any(d.code.startswith("E-SCHEMA") and d.node == field for d in diags), \
            (field, payload, [(d.code, d.node) for d in diags])


@pytest.mark.parametrize("field", EXPR_FIELDS)
def test_expression_fields_reject_or_render_from_the_tree(field):
    for payload in EXPR_PAYLOADS + PAYLOADS:
        doc = _doc()
        _set(doc, field, payload)
        kernel, diags = load(doc)
        if kernel is None:
            assert any(d.code.startswith("E-SCHEMA") and d.node.startswith(field) for d in diags), \
                (field, payload, [(d.code, d.node) for d in diags])
        else:
            _check_source(_compile(doc), payload)


@pytest.mark.parametrize("field", NOTE_FIELDS)
def test_notes_only_appear_inside_escaped_comments(field):
    for payload in PAYLOADS + EXPR_PAYLOADS + ["*/ #include <x> /*", "a\\\n#define M 0\n//"]:
        doc = _doc()
        _set(doc, field, "note " + payload + " end")
        src = _compile(doc)
        _check_source(src, payload)
        for line in _generated(src).splitlines():
            if "note " in line:
                head, _, tail = line.partition("//")
                assert "note " not in head and " end" in tail, f"note outside a comment: {line!r}"


def test_unicode_and_newline_identifiers_are_rejected():
    """Regression: `_IDENT.match` accepted a trailing newline; the expression lexer took Unicode digits."""
    for name in ("abc\n", "\u0430bc", "ab\u0661"):
        doc = _doc()
        doc["name"] = name
        assert load(doc)[0] is None
    doc = _doc()
    doc["launch"]["grid"][0] = "M + \u0661"
    assert load(doc)[0] is None
