"""Static per-iteration cost of a kernel's main (tensor-core) loop, without a GPU: compile the lowered CUDA
with NVRTC, disassemble (nvdisasm), build the instruction control-flow graph and report, for the
outermost loop that contains HMMA / HGMMA instructions:

- `loop_static`: instructions between its head and its back edge (everything, once);
- `hot`: the fewest instructions from its head to its back edge (every guarded block skipped: for the kNN
  search loop that is a database tile with no top-k insertion and no prefetch issue); inner loops
  (e.g. a per-tile norm `reduce`) count once, their bodies are listed under `inner_loops`;
- `regs`: registers per thread and `spill_bytes` (ptxas, through the compiler), `spill_instructions`:
  STL / LDL in the disassembly.

    python bench/sass_hot_path.py FILE.json [--arch sm_90a] [--kernel I]
    python bench/sass_hot_path.py --knn '{"bq": 64, "bn": 64, "split": 1, "stages": 2}' --k 10 [--arch sm_90a]

A Program is measured kernel by kernel (`--kernel I` picks one; default: the last, e.g. the kNN search).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_INS = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
_LAB = re.compile(r"^\s*(\.L_x_\d+):")


def parse(text: str):
    ins, labels = [], {}
    for ln in text.splitlines():
        m = _LAB.match(ln)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = _INS.match(ln)
        if m:
            t = re.search(r"`\((\.L_x_\d+)\)", m.group(4))
            ins.append((bool(m.group(2)), m.group(3), t.group(1) if t else None))
    return ins, labels


def loop_cost(text: str) -> dict:
    ins, labels = parse(text)
    succ = []
    for i, (pred, op, tgt) in enumerate(ins):
        base = op.split(".")[0]
        if base in ("BRA", "JMP") and tgt:
            s = [labels[tgt]] + ([i + 1] if pred else [])
        elif base in ("EXIT", "RET") and not pred:
            s = []
        else:
            s = [i + 1]
        succ.append([x for x in s if x < len(ins)])
    mma = [i for i, x in enumerate(ins) if x[1].startswith(("HMMA", "HGMMA"))]
    loops = [(labels[t], i) for i, (p, op, t) in enumerate(ins) if op.startswith("BRA") and t and labels[t] <= i]
    main = [lp for lp in loops if any(lp[0] <= h <= lp[1] for h in mma)]
    if not main:
        return {"error": "no loop with tensor-core instructions"}
    head, back = max(main, key=lambda x: x[1] - x[0])

    def shortest(head: int, back: int) -> list[int]:
        """The fewest instructions from a loop's head to its back edge (guarded blocks skipped)."""
        dist, prev, q = {head: 1}, {}, collections.deque([head])
        while q:
            u = q.popleft()
            if u == back:
                break
            for v in succ[u]:
                if v not in dist and head <= v <= back:
                    dist[v], prev[v] = dist[u] + 1, u
                    q.append(v)
        path = [back]
        while path[-1] != head:
            path.append(prev[path[-1]])
        return path
    path = shortest(head, back)
    hot = collections.Counter(ins[i][1].split(".")[0] for i in path)
    # inner loops (a centroid loop inside the point loop): all their instructions and their own hot path
    inner = [{"static": b - a + 1, "hot": len(shortest(a, b)),
              "ops": dict(collections.Counter(ins[i][1].split(".")[0] for i in range(a, b + 1)).most_common(4))}
             for a, b in loops if head < a and b < back]
    return {"loop_static": back - head + 1, "hot": len(path), "hot_ops": dict(hot.most_common(10)),
            "inner_loops": inner}


def measure(kernel, arch: str) -> dict:
    """loop_cost of the kernel's cubin as the compiler builds it (cached NVRTC), with ptxas's registers
    and spill bytes."""
    from cake_ir.analysis.sass import disassemble
    from cake_ir.compiler import compile_kernel
    res = compile_kernel(kernel.model_copy(update={"arch": arch}))
    if not res.ok:
        return {"error": "; ".join(d.short() for d in res.diagnostics if d.severity == "error")[:400]}
    text = disassemble(res.cubin)
    return {"kernel": kernel.name, "arch": arch, **loop_cost(text), "regs": res.resources.get("registers"),
            "spill_bytes": res.resources.get("spill_store_bytes", 0),
            "spill_instructions": len(re.findall(r"\b(STL|LDL)\b", text))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file", nargs="?")
    ap.add_argument("--knn", help="a cakelib knn variant (JSON params)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--metric", default="l2")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--kernel", type=int, default=-1)
    args = ap.parse_args()
    from cake_ir.nodes import Program
    if args.knn:
        from cakelib.variants import knn_kernel
        ir = knn_kernel(json.loads(args.knn), args.k, args.metric, 128, args.arch)
    else:
        from cake_ir.io import load_file
        ir, _ = load_file(args.file)
    k = ir.kernels[args.kernel] if isinstance(ir, Program) else ir
    print(json.dumps(measure(k, args.arch)))


if __name__ == "__main__":
    main()
