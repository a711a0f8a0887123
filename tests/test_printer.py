"""The text view of the IR: one line per node, each with its JSON pointer, diagnostics marked."""
import re

from _ir_samples import clone, copy_kernel, gemm_kernel

from cake_ir.diagnostics import Diagnostic
from cake_ir.io import load
from cake_ir.passes import expand
from cake_ir.printer import diagnostic_marks, format_excerpt, format_kernel, stmt_text
from cake_ir.walk import statements


def _k(doc):
    k, diags = load(doc)
    assert k is not None, [d.short() for d in diags]
    return k


def _rows(text):
    """(marked, path, text column, text) per node line (skips the diagnostic lines under marked ones)."""
    rows = []
    for ln in text.splitlines():
        m = re.match(r"^(>> |   )(/\S*)( +)(.*)$", ln)
        if m:
            rows.append((m.group(1) == ">> ", m.group(2), m.start(4), m.group(4)))
    return rows


def test_every_statement_has_a_line_with_its_path():
    for doc in (copy_kernel(), gemm_kernel()):
        k = _k(doc)
        rows = _rows(format_kernel(k))
        paths = [r[1] for r in rows]
        for site in statements(k):
            assert site.path in paths, site.path
        # Lines are in document order: statement paths appear in walk order.
        order = [p for p in paths if any(p == s.path for s in statements(k))]
        assert order == [s.path for s in statements(k)]
        assert len(paths) == len(set(paths))


def test_header_lines():
    text = format_kernel(_k(gemm_kernel()))
    rows = {r[1]: r[3] for r in _rows(text)}
    assert rows["/"].startswith("kernel gemm_bf16") and "sm_90a" in rows["/"] and "threads 384" in rows["/"]
    assert "param A: tensor bf16 [M, K]" in rows["/params/0"] and "tma box [128, 64] 128B" in rows["/params/0"]
    assert "divisible_by 64" in rows["/params/5"]
    assert "buffer sA: smem bf16 [128, 64] x4 stages swizzle_128B" in rows["/buffers/0"]
    assert "wgmma_acc" in rows["/buffers/2"]
    assert "pipeline ab: tma x4 stages" in rows["/pipelines/0"]
    assert rows["/roles/1"].startswith("role consumer") and "regs 232" in rows["/roles/1"]
    assert "BM=128" in rows["/consts"]


def test_statement_text_and_indentation():
    rows = {r[1]: r for r in _rows(format_kernel(_k(gemm_kernel())))}
    wg = rows["/roles/1/body/0/body/2"]
    assert wg[3].startswith("wgmma m64n256k16")
    assert "sA[k % 4][64 * wg:+64, :]" in wg[3] and "sB[k % 4]^T" in wg[3]
    assert "#mma" in wg[3]     # author ids are shown
    loop = rows["/roles/1/body/0"]
    assert loop[3] == "for k in [0, K / BK):"
    role = rows["/roles/1"]
    # Indentation grows with nesting (the path column is padded to one width).
    assert role[2] < loop[2] < wg[2]
    tma = rows["/roles/0/body/0/then/0/body/1"]
    assert tma[3].startswith("copy.tma_load sA[k % 4] <- A[bid.y * BM:+128, k * BK:+64]")
    assert "bar ab_full[k % 4]" in tma[3]
    assert rows["/roles/0/body/0"][3] == "if role_tid == 0:"
    assert "vec 8B" in rows["/roles/1/body/1"][3]


def test_marks_exact_and_nested_paths():
    k = _k(gemm_kernel())
    mark = {
        "/roles/1/body/0/body/2": ["E-TEST-01 error: first"],
        "/roles/1/body/0/body/2/a/offset/0": ["E-TEST-02 error: on a field"],
        "/launch/threads": ["W-TEST-03 warning: launch"],
        # only exists after expansion: attaches to the pipe_wait sugar it came from
        "/roles/1/body/0/body/0/body/0": ["E-TEST-04 error: expanded"],
        "/barriers/7": ["E-TEST-05 error: generated barrier"],
    }
    text = format_kernel(k, mark)
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(">> /roles/1/body/0/body/2 "))
    assert "E-TEST-01 error: first" in lines[i + 1] and lines[i + 1].lstrip().startswith("^")
    assert "E-TEST-02 error: on a field (at /roles/1/body/0/body/2/a/offset/0)" in lines[i + 2]
    j = next(i for i, ln in enumerate(lines) if ln.startswith(">> / "))
    assert any("W-TEST-03 warning: launch (at /launch/threads)" in ln for ln in lines[j + 1:j + 4])
    p = next(i for i, ln in enumerate(lines) if ln.startswith(">> /roles/1/body/0/body/0 "))
    assert "pipe_wait" in lines[p] and "E-TEST-04" in lines[p + 1]
    assert "(at /roles/1/body/0/body/0/body/0)" in lines[p + 1]
    assert "E-TEST-05" in text
    unmarked = [r for r in _rows(text) if not r[0]]
    assert all(r[1] not in mark for r in unmarked)


def test_multiline_mark_text_is_indented_under_the_line():
    text = format_kernel(_k(copy_kernel()), {"/roles/0/body/0": ["E-X first line\nsecond line"]})
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(">> /roles/0/body/0 "))
    assert lines[i + 1].strip() == "^ E-X first line"
    assert lines[i + 2].strip() == "second line"


def test_excerpt_shows_context_and_enclosing_nodes():
    k = _k(gemm_kernel())
    text = format_excerpt(k, {"/roles/1/body/0/body/4": ["W-X warning: here"]}, context=1)
    paths = [r[1] for r in _rows(text)]
    assert "/roles/1/body/0/body/4" in paths
    assert {"/", "/roles/1", "/roles/1/body/0"} <= set(paths)          # enclosing nodes
    assert {"/roles/1/body/0/body/3", "/roles/1/body/0/body/5"} <= set(paths)  # context
    assert "/params/0" not in paths and "/roles/0/body/0" not in paths
    assert "..." in text
    assert format_excerpt(k, {}) == ""


def test_diagnostic_marks():
    d = [Diagnostic(code="E-A-01", node="/roles/0/body/1", message="bad", legal=[4, 8]),
         Diagnostic(code="W-B-02", severity="warning", node="/roles/0/body/1", message="meh")]
    marks = diagnostic_marks(d)
    assert marks == {"/roles/0/body/1": ["E-A-01 error: bad (legal: [4, 8])", "W-B-02 warning: meh"]}
    text = format_kernel(_k(copy_kernel()), marks)
    assert text.count(">> ") == 1


def test_expanded_kernel_prints_blocks_and_generated_nodes():
    k, _ = expand(_k(gemm_kernel()))
    rows = {r[1]: r[3] for r in _rows(format_kernel(k))}
    assert rows["/roles/1/body/0/body/0"] == "block (from /roles/1/body/0/body/0):"
    assert rows["/roles/1/body/0/body/0/body/0"].startswith("mbar_wait ab_full[(k) % 4] parity=")
    assert rows["/barriers/0"].startswith("barrier ab_full: mbarrier x4 arrivals 1")
    assert "mbar_expect_tx ab_full[(k) % 4] bytes=49152" in rows["/roles/0/body/0/then/0/body/0/body/1"]
    assert rows["/prologue/0/body/0/then/0"].startswith("mbar_init ab_full[0] arrivals=1")


def test_every_op_renders():
    doc = clone(copy_kernel())
    doc["arch"] = "sm_80"
    doc["consts"] = {"T": 4}
    doc["buffers"] += [
        {"name": "s", "space": "smem", "dtype": "bf16", "shape": [64, 64], "stages": 2, "pad": 8},
        {"name": "fa", "space": "reg", "dtype": "bf16", "shape": [16, 16], "layout": "mma_a", "scope": "warp"},
        {"name": "fb", "space": "reg", "dtype": "bf16", "shape": [8, 16], "layout": "mma_b", "scope": "warp"},
        {"name": "fc", "space": "reg", "dtype": "f32", "shape": [16, 8], "layout": "mma_acc", "scope": "warp"},
    ]
    doc["barriers"] = [{"kind": "mbarrier", "name": "mb", "count": 2, "arrivals": 32},
                       {"kind": "named", "name": "nb", "bar_id": 1, "threads": 64}]
    doc["roles"][0]["body"] = [
        {"op": "let", "name": "base", "value": "bid.x * 64"},
        {"op": "copy", "kind": "cp_async", "src": {"buf": "X", "offset": ["base"], "shape": [64]},
         "dst": {"buf": "s", "slot": 1, "offset": [0, 0], "shape": [1, 64]}, "scope": "warp", "oob": "zfill"},
        {"op": "cp_async_commit"}, {"op": "cp_async_wait", "n": 1},
        {"op": "ldmatrix", "src": {"buf": "s", "shape": [16, 16]}, "dst": {"buf": "fa"}, "trans": True},
        {"op": "mma_sync", "a": {"buf": "fa"}, "b": {"buf": "fb"}, "c": {"buf": "fc"}},
        {"op": "mbar_init", "barrier": {"name": "mb", "index": 1}, "arrivals": 32},
        {"op": "mbar_arrive", "barrier": {"name": "mb"}},
        {"op": "mbar_wait", "barrier": {"name": "mb", "index": "T - 3"}, "parity": 0},
        {"op": "cp_async_arrive", "barrier": {"name": "mb"}},
        {"op": "bar_sync", "barrier": "nb"}, {"op": "fence", "kind": "proxy_async"},
        {"op": "fill", "dst": {"buf": "fc"}, "value": -1.5},
        {"op": "map", "dst": {"buf": "fc"}, "expr": "exp2(fc) * 0.5"},
        {"op": "reduce", "kind": "max", "src": {"buf": "fc"}, "dst": {"buf": "fc", "shape": [16, 1]}, "axis": 1},
        {"op": "scan", "src": {"buf": "fc"}, "dst": {"buf": "fc"}, "exclusive": True},
        {"op": "if", "cond": "warp == 0 && elect_one()", "then": [{"op": "syncwarp"}],
         "else": [{"op": "syncthreads", "note": "a note"}]},
        {"op": "for", "var": "i", "start": 1, "stop": "T", "step": 2, "unroll": True, "body": [
            {"op": "lds", "src": {"buf": "s", "slot": "i % 2"}, "dst": {"buf": "r"}, "vec_bytes": 8}]},
    ]
    k = _k(doc)
    rows = {r[1]: r[3] for r in _rows(format_kernel(k))}
    b = "/roles/0/body"
    assert rows[f"{b}/0"] == "let base = bid.x * 64"
    assert rows[f"{b}/1"] == "copy.cp_async s[1][:+1, :] <- X[base:+64]  vec 16B  scope warp  oob zfill"
    assert rows[f"{b}/2"] == "cp_async_commit" and rows[f"{b}/3"] == "cp_async_wait 1"
    assert rows[f"{b}/4"] == "ldmatrix fa <- s[:+16, :+16]  trans"
    assert rows[f"{b}/5"] == "mma_sync m16n8k16  fc += fa * fb^T"
    assert rows[f"{b}/6"] == "mbar_init mb[1] arrivals=32"
    assert rows[f"{b}/7"] == "mbar_arrive mb[0]"
    assert rows[f"{b}/8"] == "mbar_wait mb[T - 3] parity=0"
    assert rows[f"{b}/9"] == "cp_async_arrive mb[0]"
    assert rows[f"{b}/10"] == "bar_sync nb" and rows[f"{b}/11"] == "fence proxy_async"
    assert rows[f"{b}/12"] == "fill fc = -1.5"
    assert rows[f"{b}/13"] == "map fc = exp2(fc) * 0.5"
    assert rows[f"{b}/14"] == "reduce.max fc[:, :+1] <- fc axis=1"
    assert rows[f"{b}/15"] == "scan.sum fc <- fc axis=1 exclusive"
    assert rows[f"{b}/16"] == "if warp == 0 && elect_one():"
    assert rows[f"{b}/16/then/0"] == "syncwarp"
    assert rows[f"{b}/16/else"] == "else:"
    assert rows[f"{b}/16/else/0"] == "syncthreads  // a note"
    assert rows[f"{b}/17"] == "for i in [1, T) step 2 unroll:"
    assert rows[f"{b}/17/body/0"] == "lds r <- s[i % 2]  vec 8B"
    assert "barrier mb: mbarrier x2 arrivals 32" in rows["/barriers/0"]
    assert "barrier nb: named id 1 threads 64" in rows["/barriers/1"]
    assert "pad 8" in rows["/buffers/1"]
    for site in statements(k):
        assert stmt_text(site.node, k) != "?"
