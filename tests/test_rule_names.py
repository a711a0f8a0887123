"""E-NAME-01: every name an expression uses is defined where it is evaluated (scalar params, consts,
builtins, enclosing loop variables, earlier lets in an enclosing scope; register tiles in maps)."""
import glob
import json
import os

import pytest

from _ir_samples import softmax_kernel
from cake_ir.io import load, load_file
from cake_ir.verifier import load_rules, verify

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = "E-NAME-01"
RULE = [r for r in load_rules() if r.code == CODE]


def _kernel(doc):
    k, diags = load(doc)
    assert k is not None, [d.short() for d in diags]
    return k


def _names(k):
    """E-NAME-01 diagnostics of `k` (the rule alone: fast, and independent of the other rules)."""
    return list(verify(k, RULE).diagnostics)


def _softmax(edit):
    d = softmax_kernel()
    edit(d)
    return _kernel(d)


def test_rule_is_loaded_at_source_stage():
    assert len(RULE) == 1 and RULE[0].stage == "source"


def test_seq_parallel_starts_kernel_without_H():
    """Today's bug: the starts kernel's `h = hv / (HV / H)` without a scalar param H passed verify and
    failed in NVRTC. Now it is exactly one E-NAME-01, at the let's value, naming H."""
    two_pass = pytest.importorskip("tasks.kda.two_pass")
    pytest.importorskip("tasks.kda.seq_parallel")
    prog = two_pass.kda_two_pass(arch="sm_90a", segments=64)
    k = next(k for k in prog.kernels if k.name.endswith("_starts"))
    assert not [d for d in verify(k).diagnostics if d.severity == "error"]
    assert any(p.name == "H" for p in k.params)
    broken = k.model_copy(update={"params": [p for p in k.params if p.name != "H"]})
    ri, i = next((ri, i) for ri, r in enumerate(broken.roles) for i, st in enumerate(r.body)
                 if st.op == "let" and st.name == "h")
    diags = verify(broken).diagnostics
    assert [d.code for d in diags if d.severity == "error"] == [CODE], [d.short() for d in diags]
    (d,) = [d for d in diags if d.code == CODE]
    assert d.node == f"/roles/{ri}/body/{i}/value"
    assert "'H'" in d.message and "scalar param" in d.message
    assert "HV" in d.legal and "hv" in d.legal and "H" not in d.legal


def test_map_with_undefined_register_tile():
    k = _softmax(lambda d: d["roles"][0]["body"][2].update(expr="exp2((x - mx) * 1.4426950408889634)"))
    (d,) = _names(k)
    assert d.node == "/roles/0/body/2/expr" and "'mx'" in d.message
    assert {"x", "m", "s", "R"} <= set(d.legal)            # the role's register tiles and the scalars


def test_map_may_name_tiles_scalars_lets_and_builtins():
    def edit(d):
        d["roles"][0]["body"].insert(0, {"op": "let", "name": "r0", "value": "bid.x"})
        d["roles"][0]["body"][3]["expr"] = "x - m + r0 + tid + R"
    assert _names(_softmax(edit)) == []


def test_map_reading_another_roles_tile():
    def edit(d):
        d["launch"]["threads"] = 288
        d["roles"].append({"name": "aux", "warps": [8, 1], "body": []})
        d["buffers"].append({"name": "t", "space": "reg", "dtype": "f32", "shape": [1, 32], "layout": "blocked",
                             "scope": "warp", "role": "aux"})
        d["roles"][0]["body"][2]["expr"] = "x + t"
    (d,) = _names(_softmax(edit))
    assert d.node == "/roles/0/body/2/expr" and "role 'aux'" in d.message


def test_let_used_before_its_definition():
    def edit(d):
        d["roles"][0]["body"][:0] = [{"op": "let", "name": "row", "value": "r0 + 1"},
                                     {"op": "let", "name": "r0", "value": "bid.x"}]
    (d,) = _names(_softmax(edit))
    assert d.node == "/roles/0/body/0/value" and "'r0'" in d.message
    assert "later in the same scope, at /roles/0/body/1" in d.message


def test_let_in_the_other_branch_and_after_its_loop():
    def edit(d):
        d["roles"][0]["body"][:0] = [
            {"op": "if", "cond": "bid.x < R", "then": [{"op": "let", "name": "a", "value": "bid.x"}],
             "else": [{"op": "let", "name": "b", "value": "a"}]},
            {"op": "for", "var": "i", "stop": 4, "body": [{"op": "let", "name": "q", "value": "i"}]},
            {"op": "let", "name": "z", "value": "q + i"},
        ]
    got = {(d.node, d.message.split("'")[1]): d.message for d in _names(_softmax(edit))}
    assert set(got) == {("/roles/0/body/0/else/0/value", "a"), ("/roles/0/body/2/value", "q"),
                        ("/roles/0/body/2/value", "i")}
    assert "other branch of the if at /roles/0/body/0" in got["/roles/0/body/0/else/0/value", "a"]
    assert "variable of the loop at /roles/0/body/1" in got["/roles/0/body/2/value", "i"]


def test_self_reference_prologue_lets_and_loop_bounds():
    def edit(d):
        d["prologue"] = [{"op": "let", "name": "p0", "value": "tid"}]
        d["roles"][0]["body"][:0] = [{"op": "let", "name": "z", "value": "z + 1"},
                                     {"op": "for", "var": "j", "stop": "j + 4", "body": []}]
        d["roles"][0]["body"][2]["src"]["offset"] = ["p0", 0]
    got = {d.node: d.message for d in _names(_softmax(edit))}
    assert set(got) == {"/roles/0/body/0/value", "/roles/0/body/1/stop", "/roles/0/body/2/src/offset/0"}
    assert "cannot use its own name" in got["/roles/0/body/0/value"]
    assert "own variable" in got["/roles/0/body/1/stop"]
    assert "prologue" in got["/roles/0/body/2/src/offset/0"]


def test_conditions_and_tensor_params_as_values():
    def edit(d):
        d["roles"][0]["body"][:0] = [{"op": "if", "cond": "warp == 0 && elect_one() && rowz > 0", "then": []},
                                     {"op": "let", "name": "z", "value": "X + 1"}]
    got = {d.node: d.message for d in _names(_softmax(edit))}
    assert set(got) == {"/roles/0/body/0/cond", "/roles/0/body/1/value"}
    assert "'rowz'" in got["/roles/0/body/0/cond"]
    assert "tensor param" in got["/roles/0/body/1/value"] and "ld(X" in got["/roles/0/body/1/value"]


def test_grid_shapes_and_strides_name_scalars_and_consts_only():
    def edit(d):
        d["launch"]["grid"] = ["R * G"]
        d["params"][0]["shape"] = ["R", "W"]
        d["params"][1]["strides"] = ["tid", 1]
    got = {d.node: d for d in _names(_softmax(edit))}
    assert set(got) == {"/launch/grid/0", "/params/0/shape/1", "/params/1/strides/0"}
    assert got["/launch/grid/0"].legal == ["R"]
    assert "host" in got["/params/1/strides/0"].message     # a builtin, but not on the host


def test_ld_tensor_argument_is_left_to_e_ldx_01():
    k = _softmax(lambda d: d["roles"][0]["body"].insert(0, {"op": "let", "name": "z", "value": "ld(idx, 0, 0, R)"}))
    assert _names(k) == []
    assert any(d.code == "E-LDX-01" for d in verify(k).diagnostics)


def test_flagged_names_really_break_the_cuda_compile():
    """The rule's positives are NVRTC errors, not style: compiled unverified they fail to compile."""
    from cake_ir.compiler import compile_kernel
    fail = json.load(open(os.path.join(ROOT, "rules", "fixtures", CODE, "fail.json")))["kernel"]
    undefined_tile = _softmax(lambda d: d["roles"][0]["body"][2].update(expr="x - mx"))
    for k in (_kernel(fail), undefined_tile):
        assert _names(k)
        res = compile_kernel(k, verify_first=False, use_cache=False)
        assert not res.ok and any(d.code == "E-BACKEND-COMPILE" for d in res.diagnostics), \
            [d.short() for d in res.diagnostics]


def _seed_documents():
    return sorted(glob.glob(os.path.join(ROOT, "tasks", "*", "seeds", "*.json")))


@pytest.mark.parametrize("path", _seed_documents(), ids=os.path.basename)
def test_seeds_stay_clean(path):
    k, diags = load_file(path)
    assert k is not None, [d.short() for d in diags]
    assert _names(k) == [], [d.short() for d in _names(k)]


def test_passing_fixtures_stay_clean():
    for path in sorted(glob.glob(os.path.join(ROOT, "rules", "fixtures", "*", "pass.json"))):
        k = _kernel(json.load(open(path))["kernel"])
        assert _names(k) == [], (path, [d.short() for d in _names(k)])
