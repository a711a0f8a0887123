"""cake_ir.analysis.sass: static SASS instructions charged to IR nodes (nvdisasm -gi line markers,
inlined runtime-header code charged to its caller's line), and `python -m cake_ir sass`."""
import subprocess
import sys
from pathlib import Path

import pytest

from cake_ir.analysis.sass import attribute, charge_lines, find_nvdisasm

ROOT = Path(__file__).resolve().parent.parent
SAFE_SEED = ROOT / "tasks" / "kda" / "seeds" / "kda_chunked_safe_sm90a.json"

DISASM = '''
        .text.k:
	//## File "/x/cake.cu", line 40
        /*0000*/                   LDC R1, c[0x0][0x28] ;
	//## File "/x/cake.cu", line 7 inlined at "/x/cake.cu", line 52
        /*0010*/                   FMUL R2, R2, 1.4426950216293334961 ;
        /*0020*/                   MUFU.EX2 R2, R2 ;
	//## File "/x/cake.cu", line 7 inlined at "/x/cake.cu", line 9 inlined at "/x/cake.cu", line 61
        /*0030*/               @!P0 FADD R3, R2, 1 ;
	//## File "/x/cake.cu", line 61
        /*0040*/                   STS.64 [R4], R2 ;
.L_x_1:
        /*0050*/                   BRA `(.L_x_1) ;
'''


def test_instructions_go_to_the_outermost_caller_line():
    got = charge_lines(DISASM)
    assert got == {(40, "LDC"): 1, (52, "FMUL"): 1, (52, "MUFU"): 1, (61, "FADD"): 1, (61, "STS"): 1,
                   (61, "BRA"): 1}


def test_lines_fold_into_the_node_that_starts_before_them():
    from cake_ir.io import load_file
    k, _ = load_file(SAFE_SEED)
    line_map = {30: "/prologue/0", 50: "/roles/0/body/3", 60: "/roles/1/body/2"}
    prof = attribute(charge_lines(DISASM), line_map, k)
    by_path = {n.path: n for n in prof.nodes}
    assert prof.total == 6
    assert by_path["/roles/0/body/3"].count == 2 and by_path["/roles/0/body/3"].opcodes["MUFU"] == 1
    assert by_path["/roles/1/body/2"].count == 3 and by_path["/prologue/0"].count == 1
    assert prof.by_role == {"prod": 2, "cons": 3, "prologue": 1}
    assert prof.nodes[0].path == "/roles/1/body/2"          # most instructions first


needs_nvdisasm = pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")


@needs_nvdisasm
def test_profile_of_the_chunked_kda_seed():
    """The producer role holds most of the machine code (its chain binds the kernel), and the gate's
    element-wise map is the largest single node (exp / rcp per element of 16 x 128)."""
    from cake_ir.analysis.sass import sass_profile
    from cake_ir.io import load_file
    k, _ = load_file(SAFE_SEED)
    prof = sass_profile(k)
    assert prof.total > 1000
    assert prof.by_role["prod"] > 3 * prof.by_role["cons"]
    assert prof.nodes[0].op == "map" and prof.nodes[0].opcodes["MUFU"] >= 64


@needs_nvdisasm
def test_cli():
    out = subprocess.run([sys.executable, "-m", "cake_ir", "sass", str(SAFE_SEED), "--top", "3"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "SASS instructions" in out.stdout and "by role: prod" in out.stdout
    assert len([ln for ln in out.stdout.splitlines() if ln.strip().startswith(tuple("0123456789"))]) == 3
