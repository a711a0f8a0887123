"""Every IR program in the repo verifies clean and compiles with NVRTC (no GPU needed): sm_80
programs for sm_80 and sm_90a, sm_90a programs for sm_90a."""
import pathlib
import time

import pytest

from cake_ir import io
from cake_ir.compiler import compile_ir, compile_kernel
from cake_ir.verifier import verify

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROGRAMS = sorted(ROOT.glob("tasks/*/seeds/*.json"))


def _targets(k):
    return ["sm_80", "sm_90a"] if k.arch == "sm_80" else [k.arch]


CASES = []
for p in PROGRAMS:
    k, _ = io.load_file(p)
    for arch in _targets(k):
        CASES.append((p, arch))


@pytest.mark.parametrize("path,arch", CASES, ids=lambda x: x.stem if isinstance(x, pathlib.Path) else x)
def test_program_verifies_and_compiles(path, arch, tmp_path, monkeypatch):
    monkeypatch.setenv("CAKE_CACHE_DIR", str(tmp_path))
    k, diags = io.load_file(path)
    assert k is not None, diags
    res = verify(k.model_copy(update={"arch": arch}))
    assert res.ok, [d.short() for d in res.diagnostics]
    out = compile_ir(k, arch=arch, use_cache=False)
    assert out.ok, [d.short() for d in out.diagnostics]
    for part in getattr(out, "kernels", [out]):          # every kernel of a Program
        assert part.cubin and part.cubin[:4] == b"\x7fELF"
        assert part.resources.get("registers", 0) > 0
        assert part.resources.get("spill_store_bytes", 1) == 0


def test_line_map_names_nodes_for_every_statement_line():
    k, _ = io.load_file(ROOT / "tasks/gemm/seeds/gemm_wgmma_sm90a.json")
    out = compile_kernel(k, emit="cuda")
    lines = out.cuda_source.splitlines()
    mma_lines = [i for i, l in enumerate(lines, 1) if "cake_wgmma_m64n" in l and "(&acc" in l]
    assert mma_lines and all(out.line_map[i].startswith("/roles/1/body/0/body/") for i in mma_lines)
    assert all(f"// {out.line_map[i]}" in lines[i - 1] for i in mma_lines)


def test_backend_errors_map_to_node_paths(tmp_path, monkeypatch):
    """A TMA kernel forced onto sm_80 (verification bypassed) fails in ptxas; the diagnostic names
    the TMA copy's node path through the line map."""
    monkeypatch.setenv("CAKE_CACHE_DIR", str(tmp_path))
    k, _ = io.load_file(ROOT / "tasks/gemm/seeds/gemm_wgmma_sm90a.json")
    out = compile_kernel(k, arch="sm_80", verify_first=False, use_cache=False)
    assert not out.ok
    codes = {d.code for d in out.diagnostics}
    assert codes & {"E-BACKEND-PTXAS", "E-BACKEND-COMPILE"}
    assert any(d.node.startswith("/roles/") for d in out.diagnostics), [d.short() for d in out.diagnostics]


def test_compiled_artifacts_are_cached_by_content(tmp_path):
    import cake_ir.nvrtc as nv
    old = nv.CACHE_DIR
    nv.CACHE_DIR = tmp_path
    try:
        k, _ = io.load_file(ROOT / "tasks/softmax/seeds/softmax_row_n4096.json")
        a = compile_kernel(k)
        b = compile_kernel(k)
        assert not a.cached and b.cached and a.cubin == b.cubin
        c = compile_kernel(k.model_copy(update={"consts": {"N": 2048}}))
        assert not c.cached
    finally:
        nv.CACHE_DIR = old
