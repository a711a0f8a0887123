"""`python -m cake_ir ...` end to end, as subprocesses: exit codes, messages, --json output."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from _ir_samples import clone, copy_kernel, gemm_kernel

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(*args, cwd=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "cake_ir", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd or ROOT, env=env, timeout=300)
    assert "Traceback" not in p.stderr, p.stderr
    return p


@pytest.fixture()
def files(tmp_path):
    def write(name, doc):
        p = tmp_path / name
        p.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=1))
        return p

    bad_arch = clone(gemm_kernel())
    bad_arch["arch"] = "sm_80"                    # wgmma / TMA / setmaxnreg on sm_80
    wrong_type = clone(copy_kernel())
    wrong_type["launch"]["threads"] = "many"
    text = json.dumps(copy_kernel(), indent=1)
    return {
        "copy": write("copy.json", copy_kernel()),
        "gemm": write("gemm.json", gemm_kernel()),
        "violation": write("violation.json", bad_arch),
        "truncated": write("truncated.json", text[: len(text) // 2]),
        "wrong_type": write("wrong_type.json", wrong_type),
        "not_object": write("list.json", "[1, 2]"),
        "missing": tmp_path / "does_not_exist.json",
        "dir": tmp_path,
    }


# ----------------------------------------------------------------------------------- verify
def test_verify_clean(files):
    p = run("verify", files["copy"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ok" in p.stdout


def test_verify_clean_json(files):
    p = run("verify", files["copy"], "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout) == []


def test_verify_warnings_only_is_clean(files):
    p = run("verify", files["gemm"], "--json")
    diags = json.loads(p.stdout)
    assert not [d for d in diags if d["severity"] == "error"], diags
    assert p.returncode == 0


def test_verify_rule_violation(files):
    p = run("verify", files["violation"])
    assert p.returncode == 1, p.stdout + p.stderr
    assert "E-ARCH-01" in p.stdout
    # The IR is re-printed around the offending node, which is marked.
    marked = [ln for ln in p.stdout.splitlines() if ln.startswith(">>")]
    assert any("/roles/1/body/0/body/2" in ln and "wgmma" in ln for ln in marked), p.stdout


def test_verify_rule_violation_json(files):
    p = run("verify", files["violation"], "--json")
    assert p.returncode == 1
    diags = json.loads(p.stdout)
    assert isinstance(diags, list) and all(isinstance(d, dict) for d in diags)
    assert all({"code", "severity", "node", "message", "file"} <= set(d) for d in diags)
    assert any(d["code"] == "E-ARCH-01" and d["node"].startswith("/roles/1/body/0/body/2") for d in diags), diags


def test_verify_truncated_json(files):
    p = run("verify", files["truncated"])
    assert p.returncode == 2
    assert "E-PARSE-JSON" in p.stderr
    assert "line" in p.stderr and "column" in p.stderr
    assert "^" in p.stderr   # the offending source line with a caret


def test_verify_truncated_json_machine_readable(files):
    p = run("verify", files["truncated"], "--json")
    assert p.returncode == 2
    diags = json.loads(p.stdout)
    assert diags[0]["code"] == "E-PARSE-JSON"
    assert "line" in diags[0]["message"] and "column" in diags[0]["message"]


def test_verify_wrong_type_names_node_path(files):
    p = run("verify", files["wrong_type"])
    assert p.returncode == 2
    assert "/launch/threads" in p.stderr
    assert '"many"' in p.stderr   # the offending value is shown
    p = run("verify", files["wrong_type"], "--json")
    assert p.returncode == 2
    d = json.loads(p.stdout)
    assert any(x["code"].startswith("E-SCHEMA") and x["node"] == "/launch/threads" for x in d), d


def test_verify_not_an_object(files):
    p = run("verify", files["not_object"])
    assert p.returncode == 2
    assert "E-SCHEMA" in p.stderr


def test_verify_missing_file(files):
    p = run("verify", files["missing"])
    assert p.returncode == 2
    assert "cannot read" in p.stderr


def test_verify_several_files_worst_status_wins(files):
    p = run("verify", files["copy"], files["violation"], "--json")
    assert p.returncode == 1
    diags = json.loads(p.stdout)
    assert {d["file"] for d in diags} == {str(files["violation"])}
    p = run("verify", files["copy"], files["violation"], files["truncated"])
    assert p.returncode == 2


def test_no_command_and_bad_usage():
    assert run().returncode == 2
    assert run("verify").returncode == 2          # missing FILE
    assert run("frobnicate").returncode == 2


# ------------------------------------------------------------------------------------ print
def test_print(files):
    p = run("print", files["gemm"])
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert any("/roles/1/body/0/body/2" in ln and "wgmma m64n256k16" in ln for ln in lines)
    assert any(ln.split()[0] == "/params/0" for ln in lines)


def test_print_expanded_and_verify(files):
    p = run("print", files["gemm"], "--expanded")
    assert p.returncode == 0
    assert "mbar_wait ab_full" in p.stdout and "block (from /roles/1/body/0/body/0)" in p.stdout
    p = run("print", files["violation"], "--verify")
    assert p.returncode == 1
    assert any(ln.startswith(">>") for ln in p.stdout.splitlines())
    assert "E-ARCH-01" in p.stdout


def test_print_malformed(files):
    p = run("print", files["truncated"])
    assert p.returncode == 2 and "line" in p.stderr


# ------------------------------------------------------------------------------------- cost
def test_cost_text_and_json(files):
    p = run("cost", files["copy"], "--shape", "N=67108864")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "bound by memory" in p.stdout
    p = run("cost", files["gemm"], "--shape", "M=8192", "--shape", "N=8192", "--shape", "K=8192", "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["bound"] in ("compute", "memory", "issue", "latency")
    assert rep["seconds"] > 0 and rep["blocks"] == 32 * 64
    assert rep["shapes"] == {"M": 8192, "N": 8192, "K": 8192}
    assert any(n["path"] == "/roles/1/body/0/body/2" and n["kind"] == "wgmma" for n in rep["nodes"])


def test_cost_bad_shape_and_violation(files):
    p = run("cost", files["copy"], "--shape", "N=lots")
    assert p.returncode == 2 and "--shape" in p.stderr
    p = run("cost", files["violation"])
    assert p.returncode == 1 and "E-ARCH-01" in p.stdout
    p = run("cost", files["violation"], "--no-verify")
    assert p.returncode == 0


def test_cost_gpu_calibration_file(files, tmp_path):
    cal = tmp_path / "slow.json"
    cal.write_text(json.dumps({"arch": "sm_90a", "version": 1, "hbm_bw": 1.0e12}))
    fast = json.loads(run("cost", files["copy"], "--shape", "N=67108864", "--json").stdout)
    slow = json.loads(run("cost", files["copy"], "--shape", "N=67108864", "--gpu", cal, "--json").stdout)
    assert slow["terms"]["memory"] > 3 * fast["terms"]["memory"]
    p = run("cost", files["copy"], "--gpu", "no-such-gpu")
    assert p.returncode == 2


# ----------------------------------------------------------------------------------- schema
def test_schema():
    p = run("schema")
    assert p.returncode == 0
    s = json.loads(p.stdout)
    assert s.get("title") == "Kernel" and "roles" in s["properties"]


# ------------------------------------------------------------------------------------ rules
def test_rules_catalog():
    p = run("rules", "--json")
    assert p.returncode == 0
    catalog = json.loads(p.stdout)
    codes = [r["code"] for r in catalog]
    assert codes and codes == sorted(set(codes))
    assert all(r["severity"] in ("error", "warning", "note") and r["title"] for r in catalog)
    p = run("rules")
    assert p.returncode == 0
    listed = [ln.split()[0] for ln in p.stdout.splitlines()[:-1]]
    assert listed == codes
    assert p.stdout.splitlines()[-1] == f"{len(codes)} rule(s)"


def test_rules_markdown():
    catalog = json.loads(run("rules", "--json").stdout)
    p = run("rules", "--markdown")
    assert p.returncode == 0
    out = p.stdout
    assert out.startswith("# CAKE IR diagnostics")
    assert "| code | severity |" in out
    rows = [ln for ln in out.splitlines() if ln.startswith("| `")]
    for r in catalog:
        row = next(ln for ln in rows if ln.startswith(f"| `{r['code']}` |"))
        assert r["title"].replace("|", "\\|") in row
        assert row.count("|") - row.count("\\|") == 6  # five cells
    assert "E-PARSE-JSON" in out


# ---------------------------------------------------------------------------------- compile
def test_compile_cuda_to_stdout(files):
    p = run("compile", files["copy"], "--arch", "sm_90a", "--emit", "cuda")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "__global__" in p.stdout and "copy_f32" in p.stdout


def test_compile_cubin_to_file(files, tmp_path):
    out = tmp_path / "copy.cubin"
    p = run("compile", files["copy"], "--arch", "sm_90a", "-o", out)
    assert p.returncode == 0, p.stdout + p.stderr
    assert out.exists() and out.stat().st_size > 0


def test_compile_json(files, tmp_path):
    out = tmp_path / "gemm.cu"
    p = run("compile", files["gemm"], "--arch", "sm_90a", "--emit", "cuda", "-o", out, "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert doc["ok"] is True and doc["output"] == str(out)
    assert isinstance(doc["diagnostics"], list)
    assert "__global__" in out.read_text()


def test_compile_rule_violation(files):
    p = run("compile", files["violation"], "--emit", "cuda")
    assert p.returncode == 1
    assert "E-ARCH-01" in p.stdout + p.stderr
    p = run("compile", files["gemm"], "--arch", "sm_80", "--emit", "cuda", "--json")
    assert p.returncode == 1
    doc = json.loads(p.stdout)
    assert doc["ok"] is False and any(d["code"] == "E-ARCH-01" for d in doc["diagnostics"])


def test_compile_unusable_input(files):
    assert run("compile", files["truncated"]).returncode == 2
    p = run("compile", files["wrong_type"], "--json")
    assert p.returncode == 2
    doc = json.loads(p.stdout)
    assert doc["ok"] is False and doc["diagnostics"][0]["node"] == "/launch/threads"
    assert run("compile", files["copy"], "--arch", "sm_75").returncode == 2


# ---------------------------------------------------------------------------------- startup
def test_cli_module_imports_nothing_heavy():
    code = ("import sys, cake_ir.__main__ as m; "
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('numpy', 'cuda', 'pydantic')))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
