"""Build the IR cases of the fault corpus with the builder and write them next to this file.

    python tests/fault_corpus/make_corpus.py          # rewrite the JSON files
    python tests/fault_corpus/make_corpus.py --check  # exit 1 if any file is stale

Every case is a variant of the row-softmax seed (task "softmax"); cases.json lists each file with
its task, whether the verifier runs (faults the verifier would reject are compiled with
verify=False, as compile_kernel(verify_first=False) does) and the expected status / error_class.
Faults the IR cannot express are raw CUDA (*.cu) evaluated through the same path.
"""
from __future__ import annotations

import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from cake_ir.builder import KernelBuilder, bar, tile  # noqa: E402
from cake_ir.io import dumps  # noqa: E402


def softmax_variant(name: str, *, grid="M", store_offset=("bid.x", 0), store_vec=16, exp_expr=None,
                    hang=False, long_loop=False, write_input=False, note=""):
    n, warps, vec = 4096, 8, 8
    kb = KernelBuilder(name, arch="sm_90a", grid=[grid], threads=32 * warps, note=note)
    kb.const(N=n)
    kb.scalar("M", min=1)
    kb.tensor("X", "bf16", ["M", "N"], access="readwrite" if write_input else "read")
    kb.tensor("Y", "bf16", ["M", "N"], access="write")
    kb.buffer("xb", "reg", "bf16", [1, n], layout="blocked", vec=vec, scope="cta")
    kb.buffer("xf", "reg", "f32", [1, n], layout="blocked", vec=vec, scope="cta")
    kb.buffer("mx", "reg", "f32", [1, 1], scope="thread")
    kb.buffer("sm", "reg", "f32", [1, 1], scope="thread")
    if hang:
        kb.mbarrier("never", arrivals=1)
        with kb.prologue.if_("tid == 0"):
            kb.prologue.mbar_init(bar("never"), 1)
        kb.prologue.fence("mbarrier_init")
        kb.prologue.sync("syncthreads")
    with kb.role("main", warps=(0, warps)) as r:
        r.ldg(tile("X", ["bid.x", 0], [1, n]), tile("xb"), id="load_row")
        r.map("xf", "xb")
        if hang:
            r.mbar_wait(bar("never"), 0)   # nobody ever arrives
        if long_loop:
            with r.for_("i", 0, 100000, id="long_outer"):
                with r.for_("j", 0, 1000000, id="long_inner"):
                    r.map("xf", "xf * 0.999999 + 0.000001")
        r.reduce("max", "xf", "mx", id="row_max")
        r.map("xf", exp_expr or "exp2((xf - mx) * 1.4426950408889634)", id="exp")
        r.reduce("sum", "xf", "sm", id="row_sum")
        r.map("xb", "xf * recip(sm)")
        r.stg(tile("xb"), tile("Y", list(store_offset), [1, n]), vec_bytes=store_vec, id="store_row")
        if write_input:
            r.stg(tile("xb"), tile("X", ["bid.x", 0], [1, n]), id="clobber_input")
    return kb.build()


CASES = {
    "oob_write": lambda: softmax_variant(
        "oob_write", store_offset=("bid.x + 100000000", 0),
        note="stores each row 1e8 rows past the end of Y (800 GB away): illegal address"),
    "misaligned_store": lambda: softmax_variant(
        "misaligned_store", store_offset=("bid.x", 1),
        note="16-byte vector stores at a 2-byte offset: misaligned address"),
    "mbarrier_hang": lambda: softmax_variant(
        "mbarrier_hang", hang=True, note="waits on an mbarrier nobody arrives at: hangs"),
    "long_loop": lambda: softmax_variant(
        "long_loop", long_loop=True, note="1e11 dependent FMA steps per element before the softmax: runs "
                                          "far longer than the watchdog"),
    "wrong_constant": lambda: softmax_variant(
        "wrong_constant", exp_expr="exp2((xf - mx) * 1.0)", note="exp2 without the log2(e) factor: wrong result"),
    "no_max_subtraction": lambda: softmax_variant(
        "no_max_subtraction", exp_expr="exp(xf)", note="no max subtraction: exp overflows to inf on large rows"),
    "half_rows": lambda: softmax_variant(
        "half_rows", grid="cdiv(M, 2)", note="the grid covers half the rows: the rest stay unwritten"),
    "writes_input": lambda: softmax_variant(
        "writes_input", write_input=True, note="a correct softmax that also overwrites its input X"),
}


def main(check: bool = False) -> int:
    stale = []
    for name, make in CASES.items():
        path = HERE / f"{name}.json"
        text = dumps(make()) + "\n"
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(os.path.relpath(path))
    if stale:
        print("stale corpus files (run python tests/fault_corpus/make_corpus.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(check="--check" in sys.argv))
