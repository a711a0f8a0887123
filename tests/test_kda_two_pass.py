"""The two-pass chunked KDA prefill (tasks/kda/two_pass.py): a Program of a chunk-parallel prepare
kernel and a recurrence kernel sharing a workspace. On the CPU: it verifies, both kernels compile for
sm_80 and sm_90a, the workspace slots of packed sequences never collide, the SAFE fact picks the gate.
On a GPU (marked): checked through the evaluator against the float64 recurrence like the single-kernel
form (tests/test_kda_chunked.py), on the same shapes. The recurrence loader's copy mechanism `bulk`
(the sm_90a bulk copy, copy kind bulk_load) is refused on sm_80 and checked the same way on the GPU."""
import random

import pytest

from cake_ir import expr as E
from cake_ir.compiler import compile_kernel
from cake_ir.verifier import verify

POINTS = [dict(vs=32, safe=True), dict(vs=32, safe=False), dict(vs=64, safe=True, warps=1),
          dict(vs=64, safe=False, warps=4, stages=2, consumers=2), dict(vs=128, safe=False, consumers=8),
          dict(vs=32, safe=True, copy="bulk"), dict(vs=128, safe=False, consumers=8, copy="bulk"),
          dict(vs=64, safe=True, stages=3, copy="bulk")]


def _program(arch="sm_90a", **kw):
    from tasks.kda.two_pass import kda_two_pass
    return kda_two_pass(arch=arch, **kw)


@pytest.mark.parametrize("kw", POINTS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_two_pass_verifies_and_compiles(kw):
    prog = _program(**kw)
    res = verify(prog)
    assert res.ok, [d.short() for d in res.diagnostics if d.severity == "error"]
    prep, rec = prog.kernels
    assert [w.name for w in prog.workspace] == ["wsQG", "wsKD", "wsW", "wsAqk", "wsAinv", "wsDec"]
    for k in prog.kernels:
        for arch in ("sm_80", "sm_90a"):
            if arch == "sm_80" and k is rec and kw.get("copy") == "bulk":
                continue            # sm_90a only (test_bulk_copy_loader_is_refused_on_sm80)
            r = compile_kernel(k, arch=arch)
            assert r.ok, (k.name, arch, [d.short() for d in r.diagnostics if d.severity == "error"])
            # the softplus prepare sits at 255 registers: sm_80's ptxas spills a word or two, sm_90a's none
            assert r.resources["spill_store_bytes"] <= (16 if arch == "sm_80" else 0), (k.name, arch)
    assert {p.name for p in prep.params if p.kind == "tensor" and p.access == "write"} == {
        w.name for w in prog.workspace}
    assert all(p.access == "read" for p in rec.params if p.name.startswith("ws"))


def test_two_pass_rejects_points_it_does_not_build():
    with pytest.raises(ValueError, match="prepare warps"):
        _program(vs=32, warps=3)
    with pytest.raises(ValueError, match="stages"):
        _program(vs=32, stages=5)
    with pytest.raises(ValueError, match="multiples of 8"):
        _program(vs=32, consumers=8)


def _let(kernel, role: str, name: str):
    for st in kernel.role(role).body:
        if getattr(st, "op", None) == "let" and st.name == name:
            return E.parse_index(st.value)
    raise KeyError(name)


@pytest.mark.parametrize("chunk", [16, 32])
def test_workspace_slots_of_packed_sequences_never_collide_and_fit(chunk):
    """sb(n) = (bos + n C) / C as both kernels compute it (at chunk 32 the prepare kernel's const C is
    the half's 16 and its CH the chunk): every chunk of every sequence gets its own slot, inside the
    workspace's declared slot count, for random packs."""
    prog = _program(chunk=chunk)
    prep, rec = prog.kernels
    sb_prep, sb_rec = _let(prep, "prod", "sb"), _let(rec, "load", "sb")
    slots = E.parse_index(prog.workspace_tensor("wsDec").shape[0])
    rng = random.Random(3 + chunk)
    for _ in range(200):
        lens = [rng.randint(1, 4 * chunk + 12) for _ in range(rng.randint(1, 9))]
        cu = [0]
        for ln in lens:
            cu.append(cu[-1] + ln)
        T, N, HV = cu[-1], len(lens), 1
        used = set()
        for n, ln in enumerate(lens):
            sb = E.evaluate(sb_prep, {"bos": cu[n], "n": n, "C": 16, "CH": chunk})
            assert sb == E.evaluate(sb_rec, {"bos": cu[n], "n": n, "C": chunk})
            for c in range(-(-ln // chunk)):
                assert sb + c not in used
                used.add(sb + c)
        assert max(used) < E.evaluate(slots, {"T": T, "N": N, "HV": HV})


def test_two_pass_refuses_the_other_gate():
    from gpu_backend.candidate import compile_candidate
    for safe in (True, False):
        comp = compile_candidate(_program(safe=safe), "sm_90a")
        assert comp.ok, comp.diagnostics[:3]
        decl = comp.spec.scalars["SAFE"]
        assert decl.violation(int(safe)) is None and decl.violation(int(not safe)) is not None
        assert not any(a["name"].startswith("ws") for a in comp.spec.signature)


SHAPES = [
    {"T": 128, "N": 1, "H": 2, "HV": 2, "VK": 0, "H0": 0, "PACK": 0},
    {"T": 177, "N": 6, "H": 2, "HV": 4, "VK": 1, "H0": 1, "PACK": 2},
    {"T": 409, "N": 5, "H": 1, "HV": 2, "VK": 0, "H0": 0, "PACK": 4},
    {"T": 277, "N": 5, "H": 2, "HV": 2, "VK": 1, "H0": 1, "PACK": 3},
    {"T": 8192, "N": 1, "H": 4, "HV": 4, "VK": 1, "H0": 1, "PACK": 0}]


@pytest.mark.gpu
@pytest.mark.parametrize("kw", POINTS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
@pytest.mark.parametrize("shape", SHAPES)
def test_two_pass_matches_float64_on_gpu(kw, shape):
    check_on_gpu(_program(**kw), {**shape, "SAFE": int(kw["safe"])}, seed=9)


def check_on_gpu(prog, shape: dict, seed: int) -> None:
    """The evaluator's float64 check of a prefill Program at one shape (a fresh-input rerun included)."""
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    from cake_ir.io import dumps
    from gpu_backend.evaluate import evaluate
    from tasks.registry import get
    rec = evaluate(dumps(prog), get("kda").task, seed=seed, name=prog.name, shapes=[shape], profile=False, reruns=1)
    assert rec.status == "ok", rec.message


def test_search_reaches_the_two_pass_axes_through_family_tactics():
    """The default search (family tactics) moves the two-pass seed along its V-slice, warp split,
    pipeline depth, sequence-parallel segments, copy mechanism and chunk size; IR tactics, which rewrite one kernel,
    do not apply to a Program."""
    import tactics as T
    from tasks.registry import get
    g = next(g for g in get("kda").seed_genomes() if g["name"] == "kda_two_pass_safe_sm90a")
    usable = {t.name for t in T.load_tactics() if t.applicable(g) is None}
    assert usable == {"retile", "warp_split", "pipeline_depth", "sequence_parallel", "copy_mechanism", "chunk_size"}
    out = T.get_tactic("retile").apply(g, {"vs": 128})
    assert out["ir"]["name"] == "kda_two_pass_vs128_w1_p2c4" and len(out["ir"]["kernels"]) == 2
    assert out["recipe"]["params"]["vs"] == 128
    with pytest.raises(T.TacticError, match="only family tactics"):
        T.get_tactic("min_blocks").apply(g, {"min_blocks": 2})


def test_bulk_copy_loader_is_refused_on_sm80():
    """The bulk copy is the sm_90a bulk-copy engine's: the builder refuses it for sm_80 with a message
    naming the archs that have it, and the verifier does too (E-ARCH-05) for a kernel moved to sm_80."""
    from cake_ir.compiler import with_arch
    from tasks.kda.two_pass import kda_recurrence, two_pass_problem
    with pytest.raises(ValueError, match="copy 'bulk' .* needs sm_90a; sm_80 has cp_async only"):
        _program(arch="sm_80", vs=32, copy="bulk")
    assert "needs sm_90a" in two_pass_problem(32, True, 1, 2, 4, copy="bulk", arch="sm_80")
    assert two_pass_problem(32, True, 1, 2, 4, copy="bulk", arch="sm_90a") is None
    with pytest.raises(ValueError, match="copy mechanism must be one of cp_async, bulk"):
        _program(vs=32, copy="tma")
    res = verify(with_arch(kda_recurrence("sm_90a", 32, True, copy="bulk"), "sm_80"))
    hits = [d for d in res.diagnostics if d.code == "E-ARCH-05"]
    assert len(hits) == 6 and all(d.legal == ["sm_90a"] and "needs sm_90a" in d.message for d in hits)


def test_bulk_copy_loader_counts_its_barrier_and_bytes():
    """The bulk loader: one expect_tx of the chunk's bytes (six tiles, each one run at the workspace's
    padded pitch) plus 32 cp_async_arrive for v make the `full` phase (33 arrivals); it never waits for
    its own copies; the lowered loop issues six bulk copies and keeps cp.async for v only."""
    from cake_ir.analysis.tiles import bulk_rows
    from cake_ir.walk import statements
    from tasks.kda.two_pass import CHUNK_BYTES, kda_recurrence
    default = _program(vs=32)
    prog = _program(vs=32, copy="bulk")
    assert prog.name == "kda_two_pass_vs32_w1_p2c4_bulk" and default.name == "kda_two_pass_vs32_w1_p2c4"
    assert [k.name for k in prog.kernels] == ["kda_prepare16_safe_w1_pitch136", "kda_recur16_vs32_safe_p2c4_bulk"]
    assert prog.workspace_tensor("wsQG").shape[1] == 136 and default.workspace_tensor("wsQG").shape[1] == 128
    rec = prog.kernels[1]
    assert rec.barrier("full").arrivals == 33 and default.kernels[1].barrier("full").arrivals == 32
    loader = [s.node for s in statements(rec) if s.role is not None and s.role.name == "load"]
    bulk = [n for n in loader if getattr(n, "kind", None) == "bulk_load"]
    plans = [bulk_rows(rec, n.src, n.dst) for n in bulk]
    assert len(bulk) == 6 and all(p.copies == 1 for p in plans) and sum(p.merged for p in plans) == 5   # e^{G_C}: 1 row
    assert sum(p.total_bytes for p in plans) == CHUNK_BYTES == 15024
    assert [n.bytes for n in loader if n.op == "mbar_expect_tx"] == [CHUNK_BYTES]
    assert not any(n.op == "cp_async_wait" for n in loader)
    assert sum(n.op == "cp_async_arrive" for n in loader) == 1
    src = compile_kernel(kda_recurrence("sm_90a", 32, True, copy="bulk"), emit="cuda").cuda_source
    assert src.count("cake::bulk_load(") == 6


def test_search_reaches_the_copy_mechanism_through_family_tactics():
    """The default search moves the two-pass seed from cp.async to the bulk copy and back (the family's
    `copy` parameter, tactic copy_mechanism); the other axes keep the mechanism."""
    import tactics as T
    from tasks.registry import get
    g = next(g for g in get("kda").seed_genomes() if g["name"] == "kda_two_pass_safe_sm90a")
    t = T.get_tactic("copy_mechanism")
    assert t.applicable(g) is None and t.choices(g) == [{"copy": "bulk"}]
    out = t.apply(g, {"copy": "bulk"})
    assert out["ir"]["name"] == "kda_two_pass_vs32_w1_p2c4_bulk" and out["recipe"]["params"]["copy"] == "bulk"
    assert t.choices(out) == [{"copy": "cp_async"}]
    wider = T.get_tactic("retile").apply(out, {"vs": 128})
    assert wider["ir"]["name"] == "kda_two_pass_vs128_w1_p2c4_bulk"
    back = t.apply(out, {"copy": "cp_async"})
    assert back["ir"] == g["ir"] and back["recipe"]["params"]["copy"] == "cp_async"
