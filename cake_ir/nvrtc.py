"""NVRTC through cuda-python (`cuda.core`): CUDA C++ -> cubin, no GPU needed.

Compile errors and ptxas's resource report come back as E-BACKEND-* / W-BACKEND-* diagnostics that
name IR node paths through the lowering's line map. Cubins are cached on disk by a hash of
(source, arch, NVRTC version, runtime header version, options).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .diagnostics import Diagnostic

CACHE_DIR = Path(os.environ.get("CAKE_CACHE_DIR", Path.cwd() / ".cake" / "cubin"))
OPTIONS_VERSION = "1"


@dataclass
class NvrtcResult:
    cubin: Optional[bytes]
    diagnostics: list[Diagnostic] = field(default_factory=list)
    resources: dict = field(default_factory=dict)
    log: str = ""
    cached: bool = False


def nvrtc_version() -> str:
    from cuda.bindings import nvrtc
    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def _options(arch: str, reg_cap: Optional[int] = None):
    from cuda.core import ProgramOptions
    kw = dict(arch=arch, std="c++17", ptxas_options=["-v"], name="cake.cu")
    if reg_cap:
        kw["max_register_count"] = reg_cap
    return ProgramOptions(**kw)


_LINE = re.compile(r"cake\.cu\((\d+)\)")
_PTXAS_FN = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")
_PTX_LINE = re.compile(r"(?:ptx input, line|instruction at line) (\d+)")
_LOC = re.compile(r"^\s*\.loc\s+\d+\s+(\d+)\s")
_WARN_C7508 = re.compile(r"C7508|setmaxnreg ignored", re.I)
# ptxas reports this as "info", but it costs the whole kernel its wgmma overlap (every wgmma waits for the
# previous): e.g. C7514, an accumulator read by ordinary instructions inside a pipeline stage ptxas cannot
# delimit (a conditional wgmma, or one issued across a loop's back edge, while another is read)
_WGMMA_SERIAL = re.compile(r"wgmma\.mma_async instructions are serialized", re.I)


def parse_ptxas(log: str) -> dict:
    res: dict = {}
    m = _REGS.search(log)
    if m:
        res["registers"] = int(m.group(1))
    m = _SPILL.search(log)
    if m:
        res["stack_bytes"], res["spill_store_bytes"], res["spill_load_bytes"] = map(int, m.groups())
    m = _SMEM.search(log)
    res["static_smem_bytes"] = int(m.group(1)) if m else 0
    return res


def _node_for_line(line_map: dict[int, str], line: int) -> str:
    best = None
    for ln in sorted(line_map):
        if ln <= line:
            best = line_map[ln]
        else:
            break
    return best or "/"


def _ptx_source_lines(source: str, arch: str) -> dict[int, int]:
    """PTX line -> CUDA source line, from a -lineinfo PTX compile (only run when ptxas failed, to
    map its PTX-line errors back to IR nodes)."""
    from cuda.bindings import nvrtc
    virt = "compute_" + arch.removeprefix("sm_")
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"cake.cu", 0, [], [])
    try:
        opts = [f"--gpu-architecture={virt}".encode(), b"-lineinfo", b"--std=c++17"]
        if nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return {}
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetPTX(prog, buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    out, cur = {}, None
    for i, line in enumerate(buf.decode(errors="replace").splitlines(), 1):
        m = _LOC.match(line)
        if m:
            cur = int(m.group(1))
        elif cur is not None:
            out[i] = cur
    return out


def _cache_key(source: str, arch: str, reg_cap) -> str:
    from .lower import header_text
    h = hashlib.sha256()
    for part in (source, arch, nvrtc_version(), str(reg_cap), OPTIONS_VERSION, header_text()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def nvrtc_compile(source: str, arch: str, line_map: dict[int, str], kernel_name: str,
                  reg_cap: Optional[int] = None, use_cache: bool = True) -> NvrtcResult:
    from cuda.core import Program

    key = _cache_key(source, arch, reg_cap)
    cubin_path, meta_path = CACHE_DIR / f"{key}.cubin", CACHE_DIR / f"{key}.json"
    if use_cache and cubin_path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        return NvrtcResult(cubin_path.read_bytes(), [Diagnostic(**d) for d in meta["diagnostics"]],
                           meta["resources"], meta["log"], cached=True)
    log = io.StringIO()
    diags: list[Diagnostic] = []
    cubin = None
    try:
        prog = Program(source, code_type="c++", options=_options(arch, reg_cap))
        obj = prog.compile("cubin", logs=log)
        cubin = bytes(obj.code)
    except Exception as e:  # NVRTC/ptxas errors arrive as exceptions carrying the log
        text = str(e)
        log.write(text)
        ptx_lines = None
        for raw in text.splitlines():
            m = _LINE.search(raw)
            if "error" not in raw.lower() and "fatal" not in raw.lower():
                continue
            node = _node_for_line(line_map, int(m.group(1))) if m else "/"
            pm = _PTX_LINE.search(raw)
            if pm and not m:
                if ptx_lines is None:
                    ptx_lines = _ptx_source_lines(source, arch)
                src_line = ptx_lines.get(int(pm.group(1)))
                if src_line:
                    node = _node_for_line(line_map, src_line)
            code = "E-BACKEND-PTXAS" if "ptxas" in raw else "E-BACKEND-COMPILE"
            diags.append(Diagnostic(code=code, node=node, message=raw.strip()[:400]))
        if not diags:
            diags.append(Diagnostic(code="E-BACKEND-COMPILE", node="/", message=text.strip()[:400]))
    text = log.getvalue().replace("\x00", "")
    res = parse_ptxas(text)
    if cubin is not None:
        for raw in text.splitlines():
            if _WGMMA_SERIAL.search(raw):
                diags.append(Diagnostic(code="W-BACKEND-WGMMA-SERIAL", severity="warning", node="/roles",
                                        message=raw.strip()[:400]))
            elif "warning" in raw.lower():
                m = _LINE.search(raw)
                node = _node_for_line(line_map, int(m.group(1))) if m else "/"
                code = "W-BACKEND-SETMAXNREG" if _WARN_C7508.search(raw) else "W-BACKEND-WARNING"
                diags.append(Diagnostic(code=code, severity="warning", node=node, message=raw.strip()[:400]))
        if "registers" in res:
            diags.append(Diagnostic(code="N-BACKEND-RESOURCES", severity="note", node="/launch",
                                    message=f"ptxas ({arch}): {res['registers']} registers/thread, "
                                            f"{res.get('stack_bytes', 0)} B stack, {res.get('spill_store_bytes', 0)} B spill "
                                            f"stores, {res.get('static_smem_bytes', 0)} B static shared memory"))
        if res.get("spill_store_bytes", 0) or res.get("spill_load_bytes", 0):
            diags.append(Diagnostic(code="W-BACKEND-SPILL", severity="warning", node="/roles",
                                    message=f"ptxas spills: {res['spill_store_bytes']} bytes stored, "
                                            f"{res['spill_load_bytes']} loaded (stack {res['stack_bytes']} bytes)"))
        elif res.get("stack_bytes", 0):
            diags.append(Diagnostic(code="W-BACKEND-LOCAL", severity="warning", node="/buffers",
                                    message=f"{res['stack_bytes']} bytes of local memory (a register array indexed at run time?)"))
        if use_cache:
            CACHE_DIR.mkdir(parents=True, exist_ok=True)
            # Unique temporaries + atomic renames: concurrent workers may compile the same kernel.
            tag = f".{os.getpid()}.{os.urandom(4).hex()}.tmp"
            meta = json.dumps({"diagnostics": [d.model_dump() for d in diags], "resources": res,
                               "log": text, "kernel": kernel_name, "arch": arch})
            for path, data in ((cubin_path, cubin), (meta_path, meta.encode())):
                tmp = path.with_name(path.name + tag)
                tmp.write_bytes(data)
                os.replace(tmp, path)
    return NvrtcResult(cubin, diags, res, text)
