"""Programs: several kernels launched in order with a runtime-allocated workspace, through load/dump,
the verifier (E-PRG-* rules), compile, the evaluator's spec, the cost model, the printer, the CLI and
(on a GPU) CompiledProgram, the evaluator and cakelib's runtime.

The sample: kernel `scale` writes ws[i] = 2 * x[i], kernel `shift` reads it and writes y[i] = ws[i] + 1.
"""
import copy
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from cake_ir.builder import KernelBuilder, tile
from cake_ir.io import canonical_dict, dumps, ir_hash, load, to_dict
from cake_ir.nodes import Kernel, Program, Workspace
from cake_ir.verifier import verify
from tasks.base import TensorSpec, Tolerance

ROOT = pathlib.Path(__file__).resolve().parent.parent


def elementwise(name, src, dst, expr, arch="sm_80"):
    """dst[i] = expr(r = src[i]) for N f32 elements, 256 per CTA."""
    kb = KernelBuilder(name, arch=arch, grid=["N / 256"], threads=256)
    kb.tensor(src, "f32", ["N"])
    kb.tensor(dst, "f32", ["N"], access="write")
    kb.scalar("N", min=256, divisible_by=256)
    kb.buffer("r", "reg", "f32", [256], layout="blocked", scope="cta", vec=1)
    with kb.role("main", warps=(0, 8)) as r:
        r.ldg(tile(src, ["bid.x * 256"], [256]), tile("r"), vec_bytes=4)
        r.map(tile("r"), expr)
        r.stg(tile("r"), tile(dst, ["bid.x * 256"], [256]), vec_bytes=4)
    return kb.build()


def two_step(arch="sm_80") -> Program:
    return Program(name="two_step", arch=arch, workspace=[Workspace(name="ws", dtype="f32", shape=["N"])],
                   kernels=[elementwise("scale", "x", "ws", "2 * r", arch),
                            elementwise("shift", "ws", "y", "r + 1", arch)])


def doc() -> dict:
    return copy.deepcopy(to_dict(two_step()))


# ----------------------------------------------------------------------------------------- io
def test_load_dump_round_trip():
    p = two_step()
    text = dumps(p)
    q, diags = load(text)
    assert diags == [] and isinstance(q, Program) and q == p
    assert [type(k) for k in q.kernels] == [Kernel, Kernel] and q.workspace[0].name == "ws"
    assert to_dict(q) == json.loads(text) and canonical_dict(q) == canonical_dict(p)
    assert ir_hash(q) == ir_hash(p) and ir_hash(p) != ir_hash(p.kernels[0])
    k, _ = load(to_dict(p.kernels[0]))
    assert isinstance(k, Kernel)                                 # no "kernels" key: still a Kernel


def test_schema_diagnostics_point_into_the_program():
    d = doc()
    d["kernels"][1]["roles"][0]["body"][1]["op"] = "frobnicate"
    d["kernels"][0]["launch"]["threads"] = "many"
    p, diags = load(d)
    assert p is None
    nodes = {x.node for x in diags}
    assert "/kernels/1/roles/0/body/1" in nodes and "/kernels/0/launch/threads" in nodes, nodes


def test_duplicate_kernel_names_rejected():
    d = doc()
    d["kernels"][1]["name"] = "scale"
    p, diags = load(d)
    assert p is None and any("already used" in x.message for x in diags)


# ----------------------------------------------------------------------------------- verifier
def test_verify_ok_and_fast():
    p = two_step()
    verify(p)
    res = verify(p)
    assert res.ok and res.diagnostics == [], [x.short() for x in res.diagnostics]
    assert len(res.kernels) == 2 and all(r.ok for r in res.kernels)
    assert all(isinstance(e, Kernel) for e in res.expanded)
    assert res.seconds < 0.5


def test_kernel_diagnostics_are_prefixed():
    d = doc()
    d["kernels"][1]["launch"]["threads"] = 320              # roles no longer cover the CTA's 10 warps
    p, _ = load(d)
    res = verify(p)
    assert not res.ok
    assert all(x.node.startswith("/kernels/1") for x in res.diagnostics if x.severity == "error"), \
        [x.short() for x in res.diagnostics]
    # the kernel on its own reports the same codes at unprefixed paths
    own = verify(p.kernels[1])
    assert {x.code for x in own.diagnostics} == {x.code for x in res.diagnostics}
    assert {"/kernels/1" + x.node for x in own.diagnostics} == {x.node for x in res.diagnostics}


def _broken(code):
    d = doc()
    if code == "E-PRG-01":
        d["kernels"][1]["arch"] = "sm_90a"
        return d, "/kernels/1/arch"
    if code == "E-PRG-02":
        d["kernels"][1]["params"][0]["dtype"] = "bf16"
        return d, "/kernels/1/params/0/dtype"
    if code == "E-PRG-02-shape":
        d["kernels"][0]["params"][1]["shape"] = ["N + 256"]
        return d, "/kernels/0/params/1/shape"
    if code == "E-PRG-03":
        d["kernels"][0]["params"][1]["access"] = "read"          # `scale` no longer writes ws
        return d, "/kernels/0/params/1/access"
    if code == "W-PRG-04":
        d["workspace"].append({"name": "spare", "dtype": "f32", "shape": ["N", 4]})
        return d, "/workspace/1"
    if code == "E-PRG-05":
        d["kernels"][1]["params"][2]["dtype"] = "u32"
        return d, "/kernels/1/params/2/dtype"
    raise AssertionError(code)


@pytest.mark.parametrize("variant", ["E-PRG-01", "E-PRG-02", "E-PRG-02-shape", "E-PRG-03", "W-PRG-04", "E-PRG-05"])
def test_program_rule_fires_at_its_node(variant):
    code = variant[:8]
    d, node = _broken(variant)
    p, diags = load(d)
    assert p is not None, [x.short() for x in diags]
    res = verify(p)
    hits = [x for x in res.diagnostics if x.code == code]
    assert [x.node for x in hits] == [node], [x.short() for x in res.diagnostics]
    assert res.ok == code.startswith("W")
    assert not any(x.code == "E-VERIFY-INTERNAL" for x in res.diagnostics)


def test_shapes_compare_as_expressions():
    d = doc()
    d["kernels"][1]["params"][0]["shape"] = ["N * 1"]
    p, _ = load(d)
    assert not [x for x in verify(p).diagnostics if x.code == "E-PRG-02"]


def test_kernel_verify_skips_program_rules():
    from cake_ir.verifier import load_rules
    assert {r.code for r in load_rules() if r.stage == "program"} >= {"E-PRG-01", "E-PRG-02", "E-PRG-03", "E-PRG-05"}
    res = verify(two_step().kernels[1])          # reads ws with access read: fine for a lone kernel
    assert res.ok and not any(x.code.split("-")[1] == "PRG" for x in res.diagnostics)


# ------------------------------------------------------------------------------------ compile
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compile_program(arch):
    from cake_ir.compiler import compile_ir, compile_program
    res = compile_program(two_step(), arch=arch)
    assert res.ok, [x.short() for x in res.diagnostics]
    assert res.arch == arch and [k.arch for k in res.kernels] == [arch, arch]
    assert [k.kernel_name for k in res.kernels] == ["scale", "shift"] and all(k.cubin for k in res.kernels)
    assert all(x.node.startswith("/kernels/") for x in res.diagnostics)
    assert res.seconds["nvrtc"] >= 0 and "lower" in res.seconds
    assert type(compile_ir(two_step(), arch=arch, emit="cuda")).__name__ == "ProgramCompileResult"
    assert type(compile_ir(two_step().kernels[0], arch=arch, emit="cuda")).__name__ == "CompileResult"


def test_compile_program_stops_on_verify_errors():
    from cake_ir.compiler import compile_program
    d, node = _broken("E-PRG-03")
    p, _ = load(d)
    res = compile_program(p, emit="cuda")
    assert not res.ok and res.kernels == [] and node in {x.node for x in res.diagnostics}
    assert compile_program(p, emit="cuda", verify_first=False).ok      # the fault corpus path


# ------------------------------------------------------------------------- evaluator's view
class TinyTask:
    """A task double: y = 2 x + 1 over N f32 elements."""
    name = "two_step_task"
    shapes = [{"N": 256}, {"N": 1024}, {"N": 4096}]
    bench_shapes = [{"N": 1 << 16}]

    tolerance = Tolerance(1e-6)

    def inputs(self, shape):
        return [TensorSpec("x", (shape["N"],), "f32")]

    def outputs(self, shape):
        return [TensorSpec("y", (shape["N"],), "f32")]

    def make_inputs(self, shape, seed, rng=None):
        return {"x": np.random.default_rng(seed).standard_normal(shape["N"]).astype(np.float32)}

    def reference(self, inputs, shape):
        return {"y": 2.0 * inputs["x"].astype(np.float64) + 1.0}

    def scalars(self, shape):
        return {"N": int(shape["N"])}

    def flops(self, shape):
        return 2.0 * shape["N"]

    def bytes(self, shape):
        return 8.0 * shape["N"]


def test_program_spec_hides_the_workspace():
    from gpu_backend.candidate import compile_candidate
    from gpu_backend.evaluate import interface_problem
    from gpu_backend.runner import ProgramSpec
    c = compile_candidate(dumps(two_step()), "sm_90a")
    assert c.ok and isinstance(c.spec, ProgramSpec) and c.kernel == two_step()
    spec = c.spec
    assert [a["name"] for a in spec.signature] == ["x", "N", "y"]
    assert set(spec.tensors) == {"x", "y"} and set(spec.scalars) == {"N"}
    assert spec.scalars["N"].violation(128) and spec.scalars["N"].violation(300) and not spec.scalars["N"].violation(512)
    assert spec.workspace_shapes({"N": 512}) == {"ws": [512]}
    assert spec.shape_problem({"x": [512], "y": [512]}, {"N": 512}) is None
    assert "y" in spec.shape_problem({"x": [512], "y": [256]}, {"N": 512})
    assert spec.grid_dims({"N": 512}) == [[2], [2]]
    assert interface_problem(spec, TinyTask(), {"N": 256}) is None
    info = c.info
    assert info["registers"] > 0 and info["spill_bytes"] == 0 and [k["name"] for k in info["kernels"]] == ["scale", "shift"]
    assert compile_candidate(dumps(two_step("sm_90a")), "sm_80").error_class == "arch_mismatch"


def test_fault_hint_for_a_program():
    from gpu_backend.evaluate import fault_hint
    d, node = _broken("E-PRG-03")
    hint = fault_hint({"verify": False, "candidate": json.dumps(d)})
    assert hint is not None and hint[0] == node


def test_compile_job_reports_a_program():
    from agent.jobs import compile_job
    rec = compile_job({"ir": to_dict(two_step()), "name": "p"})
    assert rec["status"] == "ok", rec
    assert rec["compile"]["kernel_name"] == "scale+shift" and rec["compile"]["registers"] > 0


# ------------------------------------------------------------------------------- cost, printer
def test_cost_sums_the_kernels():
    from cake_ir.cost import estimate
    p = two_step()
    shape = {"N": 1 << 20}
    rep = estimate(p, shape)
    parts = [estimate(k, shape) for k in p.kernels]
    assert rep.seconds == pytest.approx(sum(r.seconds for r in parts)) and rep.seconds > 0
    assert rep.dram_bytes == pytest.approx(sum(r.dram_bytes for r in parts))
    assert rep.smem_bytes == max(r.smem_bytes for r in parts)
    assert [r.kernel for r in rep.kernels] == ["scale", "shift"]
    assert rep.binding_path.startswith("/kernels/") and rep.node("/kernels/1/roles/0/body/2") is not None
    json.dumps(rep.to_dict(), default=str)
    assert "/kernels/1 shift" in rep.summary()


def test_printer_formats_a_program():
    from cake_ir.printer import format_excerpt, format_kernel
    text = format_kernel(two_step())
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["/", "program", "two_step"]
    assert any(ln.split()[:3] == ["/workspace/0", "workspace", "ws:"] for ln in lines)
    assert any(ln.split()[:3] == ["/kernels/1", "kernel", "shift"] for ln in lines)
    assert any(ln.split()[0] == "/kernels/1/roles/0/body/1" and "r + 1" in ln for ln in lines)
    ex = format_excerpt(two_step(), {"/kernels/1/params/0/access": ["E-PRG-03 error: x"]})
    assert ">> /kernels/1/params/0" in ex and "E-PRG-03" in ex and "/kernels/0/params" not in ex


# ---------------------------------------------------------------------------------------- CLI
def _cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "cake_ir", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd or ROOT, env=env, timeout=300)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_cli_on_program_files(tmp_path):
    good, bad = tmp_path / "p.json", tmp_path / "bad.json"
    good.write_text(dumps(two_step()))
    bad.write_text(json.dumps(_broken("E-PRG-03")[0]))
    r = _cli("verify", good, bad)
    assert r.returncode == 1 and f"{good}: ok" in r.stdout and "E-PRG-03 error at /kernels/0/params/1/access" in r.stdout
    r = _cli("verify", "--json", good)
    assert r.returncode == 0 and json.loads(r.stdout) == []
    r = _cli("print", good)
    assert r.returncode == 0 and "program two_step" in r.stdout
    r = _cli("cost", good, "--shape", "N=1048576")
    assert r.returncode == 0 and "/kernels/0 scale" in r.stdout
    r = _cli("compile", good, "--arch", "sm_90a", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "p.scale.cubin").stat().st_size > 0 and (tmp_path / "p.shift.cubin").exists()
    r = _cli("compile", bad, "--emit", "cuda")
    assert r.returncode == 1 and "E-PRG-03" in r.stdout


# ---------------------------------------------------------------------------------------- GPU
def _gpu():
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.gpu
def test_compiled_program_runs_on_gpu():
    _gpu()
    from cake_ir.compiler import compile_program
    from gpu_backend.candidate import target_arch
    from gpu_backend.driver import arch_of, context, properties
    from gpu_backend.memory import DeviceArray, synchronize
    from gpu_backend.runner import CompiledProgram
    context(0)
    p = two_step()
    arch = target_arch(p.arch, arch_of(properties(0)))
    prog = CompiledProgram.from_ir(p, compile_program(p, arch=arch))
    try:
        for n in (256, 4096, 4096):
            x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
            with DeviceArray.from_host(x, "f32") as X, DeviceArray.alloc((n,), "f32") as Y:
                Y.poison()
                prog({"x": X, "y": Y}, {"N": n})
                synchronize()
                np.testing.assert_allclose(Y.download(), 2 * x + 1, rtol=1e-6)
        # one buffer per workspace name: grown once (256 -> 4096 floats), then reused
        assert len(prog.pool().buffers) == 1 and len(prog.pool().retired) == 1
        assert prog.pool().buffers["ws"].nbytes == 4096 * 4
    finally:
        prog.unload()


@pytest.mark.gpu
def test_program_through_the_evaluator():
    _gpu()
    from gpu_backend.evaluate import evaluate
    rec = evaluate(dumps(two_step()), TinyTask(), 0, reps=5, warmup=1)
    assert rec.status == "ok", rec.message
    assert all(s.ok for s in rec.shapes) and rec.timings and rec.timings[0].ms_median > 0
    assert [k["name"] for k in rec.compile["kernels"]] == ["scale", "shift"]
    bad = copy.deepcopy(to_dict(two_step()))
    bad["kernels"][1]["roles"][0]["body"][1]["expr"] = "r + 2"
    rec = evaluate(json.dumps(bad), TinyTask(), 0, profile=False)
    assert rec.status == "fail" and rec.error_class == "wrong_result", rec.message


@pytest.mark.gpu
def test_cakelib_runtime_loads_a_program():
    _gpu()
    from cakelib.runtime import runtime
    from gpu_backend.memory import DeviceArray, synchronize
    from gpu_backend.runner import CompiledProgram
    rt = runtime(0)
    kern = rt.kernel(("test_program", "two_step"), lambda arch: two_step())
    assert isinstance(kern, CompiledProgram) and rt.kernel(("test_program", "two_step"), None) is kern
    x = np.arange(512, dtype=np.float32)
    with DeviceArray.from_host(x, "f32") as X, DeviceArray.alloc((512,), "f32") as Y:
        rt.launch(kern, {"x": X, "y": Y}, {"N": 512})
        synchronize()
        np.testing.assert_allclose(Y.download(), 2 * x + 1)


def test_workspace_grows_instead_of_one_buffer_per_shape(monkeypatch):
    """WorkspacePool: one buffer per name, grown x2 (or to fit) when a larger shape needs more, reused
    for smaller ones; outgrown buffers stay allocated until free (prepared launches may point into
    them). Device allocation is replaced by a recording double: no GPU needed."""
    from gpu_backend import memory
    from gpu_backend.runner import TensorDecl, WorkspacePool

    allocs, freed = [], []

    class FakeArray:
        def __init__(self, shape, dtype):
            self.nbytes, self.ptr = int(np.prod(shape)) * memory.SIZE[dtype], 0x1000 * (len(allocs) + 1)
            allocs.append(self)

        def free(self):
            freed.append(self)

    monkeypatch.setattr(memory.DeviceArray, "alloc", classmethod(lambda cls, shape, dtype: FakeArray(shape, dtype)))
    pool = WorkspacePool([("ws", TensorDecl("f32", ["N"]))])
    seen = [pool.get({"ws": [n]})["ws"] for n in (256, 100, 4096, 300, 5000)]
    assert [s[1] for s in seen] == [[256], [100], [4096], [300], [5000]]     # each launch's own shape
    assert [a.nbytes for a in allocs] == [1024, 16384, 32768]                # grown twice, x2 or to fit
    assert seen[0][0] == seen[1][0] and seen[2][0] == seen[3][0] != seen[0][0]
    pool.free()
    assert sorted(id(a) for a in freed) == sorted(id(a) for a in allocs)
