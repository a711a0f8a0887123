"""Static SASS instructions per IR node: where a kernel's machine code goes, without a GPU.

The lowered CUDA is compiled by NVRTC with line info, disassembled by `nvdisasm -gi`, and every
instruction is charged to the IR node whose C++ line produced it (an inlined runtime-header function
is charged to the line that called it). Counts are static (a loop body's instructions once), which
is what a chain-bound loop costs per iteration: the KDA producer's 6k instructions per chunk, say.

nvdisasm is not part of NVRTC: it comes with a CUDA toolkit or the `nvidia-cuda-nvdisasm` wheel;
`find_nvdisasm` looks at $CAKE_NVDISASM, the PATH and that wheel's folder.

A Program is profiled kernel by kernel; its profile's node paths carry `/kernels/{i}` and its roles
are named `kernel/role`, so the counts feed `cost.estimate(program, sass=...)` unchanged.
"""
from __future__ import annotations

import bisect
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

_MARK = re.compile(r'^\s*//## File "[^"]*", line (\d+)(.*)$')
_INLINED = re.compile(r'inlined at "[^"]*", line (\d+)')
_INSTR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


@dataclass
class NodeSass:
    path: str
    op: str
    count: int = 0
    opcodes: Counter = field(default_factory=Counter)


@dataclass
class SassProfile:
    kernel: str
    arch: str
    total: int
    nodes: list[NodeSass]             # most instructions first
    by_role: dict[str, int]           # role name (or "prologue" / "kernel") -> instructions

    def table(self, top: int = 25) -> str:
        lines = [f"{self.kernel} ({self.arch}): {self.total} SASS instructions",
                 "  by role: " + ", ".join(f"{r} {n}" for r, n in sorted(self.by_role.items(), key=lambda x: -x[1]))]
        lines.append(f"  {'count':>6}  {'op':<10} {'node':<34} top opcodes")
        for n in self.nodes[:top]:
            ops = " ".join(f"{o}:{c}" for o, c in n.opcodes.most_common(4))
            lines.append(f"  {n.count:>6}  {n.op:<10} {n.path:<34} {ops}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "arch": self.arch, "total": self.total, "by_role": self.by_role,
                "nodes": [{"path": n.path, "op": n.op, "count": n.count, "opcodes": dict(n.opcodes)}
                          for n in self.nodes]}


def find_nvdisasm() -> Optional[str]:
    env = os.environ.get("CAKE_NVDISASM")
    if env and os.path.exists(env):
        return env
    hit = shutil.which("nvdisasm")
    if hit:
        return hit
    try:
        import nvidia  # the nvidia-cuda-nvdisasm wheel: nvidia/cu1x/bin/nvdisasm
        for root in getattr(nvidia, "__path__", []):
            for sub in sorted(os.listdir(root), reverse=True):
                cand = os.path.join(root, sub, "bin", "nvdisasm")
                if os.path.exists(cand):
                    return cand
    except ImportError:
        pass
    return None


def charge_lines(disasm: str) -> Counter:
    """(source line, opcode) -> instructions, from `nvdisasm -gi` text: each instruction is charged to
    the outermost caller line of its location marker."""
    out: Counter = Counter()
    line = 0
    for raw in disasm.splitlines():
        m = _MARK.match(raw)
        if m:
            calls = _INLINED.findall(m.group(2))
            line = int(calls[-1]) if calls else int(m.group(1))
            continue
        m = _INSTR.match(raw)
        if m:
            out[(line, m.group(1).split(".")[0])] += 1
    return out


def attribute(charged: Counter, line_map: dict[int, str], kernel) -> SassProfile:
    """Fold per-line counts into per-node counts (a line belongs to the last node that starts at or
    before it) and per-role totals."""
    from ..walk import statements
    ops = {s.path: getattr(s.node, "op", "?") for s in statements(kernel)}
    starts = sorted(line_map)
    nodes: dict[str, NodeSass] = {}
    for (ln, opcode), n in charged.items():
        i = bisect.bisect_right(starts, ln) - 1
        path = line_map[starts[i]] if i >= 0 else "/"
        node = nodes.get(path)
        if node is None:
            node = nodes[path] = NodeSass(path, ops.get(path, "-"))
        node.count += n
        node.opcodes[opcode] += n
    by_role: Counter = Counter()
    for path, node in nodes.items():
        m = re.match(r"/roles/(\d+)/", path)
        if m and int(m.group(1)) < len(kernel.roles):
            by_role[kernel.roles[int(m.group(1))].name] += node.count
        else:
            by_role["prologue" if path.startswith("/prologue") else "kernel"] += node.count
    ordered = sorted(nodes.values(), key=lambda x: -x.count)
    return SassProfile(kernel.name, kernel.arch, sum(charged.values()), ordered, dict(by_role))


def sass_profile(kernel, arch: Optional[str] = None, nvdisasm: Optional[str] = None,
                 lowered=None) -> SassProfile:
    """Lower (or take `lowered`, a CompileResult of this kernel that carries its CUDA source and line
    map), compile with line info (its per-line counts cached on disk) and attribute. Raises
    RuntimeError with the reason when the kernel does not lower or nvdisasm is missing.
    A Program (`lowered` then a ProgramCompileResult) gives one profile summed over its kernels."""
    from ..compiler import compile_kernel
    from ..nodes import Program
    if isinstance(kernel, Program):
        return _program_profile(kernel, arch, nvdisasm, lowered)
    tool = nvdisasm or find_nvdisasm()
    if tool is None:
        raise RuntimeError("nvdisasm not found: install nvidia-cuda-nvdisasm or set CAKE_NVDISASM")
    if arch and arch != kernel.arch:
        kernel = kernel.model_copy(update={"arch": arch})
    if lowered is None or not lowered.cuda_source or lowered.arch != kernel.arch:
        lowered = compile_kernel(kernel, emit="cuda")
    if not lowered.ok:
        errs = [d.short() for d in lowered.diagnostics if d.severity == "error"][:3]
        raise RuntimeError("the kernel does not lower: " + "; ".join(errs))
    return attribute(_charged(lowered.cuda_source, kernel.arch, tool), lowered.line_map, kernel)


def _program_profile(program, arch, nvdisasm, lowered) -> SassProfile:
    from dataclasses import replace

    from ..walk import program_path
    per = [sass_profile(k, arch, nvdisasm, lowered.kernels[i] if lowered is not None and i < len(lowered.kernels)
                        else None) for i, k in enumerate(program.kernels)]
    nodes = [replace(n, path=program_path(i, n.path)) for i, p in enumerate(per) for n in p.nodes]
    by_role = {f"{p.kernel}/{r}": c for p in per for r, c in p.by_role.items()}
    return SassProfile(program.name, arch or program.arch, sum(p.total for p in per),
                       sorted(nodes, key=lambda x: -x.count), by_role)


def disassemble(cubin: bytes, tool: Optional[str] = None, *flags: str) -> str:
    """nvdisasm's text of a cubin (`flags` e.g. "-gi" for line info; the code section only)."""
    tool = tool or find_nvdisasm()
    if tool is None:
        raise RuntimeError("nvdisasm not found (install nvidia-cuda-nvdisasm or set CAKE_NVDISASM)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, *flags, "-c", f.name], capture_output=True, text=True, check=True).stdout


def _charged(source: str, arch: str, tool: str) -> Counter:
    """charge_lines of the source's line-info compile, kept on disk next to the NVRTC cache (keyed by
    the source and arch: a dry run asks again for every resumed or repeated candidate)."""
    import hashlib
    import json

    from ..nvrtc import CACHE_DIR
    key = hashlib.sha256(f"sass-v1\0{arch}\0{source}".encode()).hexdigest()[:32]
    path = CACHE_DIR / f"{key}.sass.json"
    if path.exists():
        try:
            return Counter({(int(ln), op): n for ln, op, n in json.loads(path.read_text())})
        except (ValueError, TypeError):
            pass
    from cuda.core import Program, ProgramOptions
    opts = ProgramOptions(arch=arch, std="c++17", name="cake.cu", lineinfo=True)
    cubin = bytes(Program(source, code_type="c++", options=opts).compile("cubin").code)
    charged = charge_lines(disassemble(cubin, tool, "-gi"))
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([[ln, op, n] for (ln, op), n in charged.items()]))
        os.replace(tmp, path)                # atomic: concurrent workers may profile the same kernel
    except OSError:
        pass
    return charged
