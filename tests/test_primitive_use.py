"""Accepted IR primitives offered to the proposers: the LLM prompt's listing, primitive statements in
replies (agent/primitive_use.py) and the search tactic primitive_variant. The primitives are made by the
real promoter (knowledge/promote/primitive.py) from recurring windows of real seeds and registered
by patching the primitives registry's cache (primitives/ itself holds none)."""
import copy
import json
import random
import types

import pytest

import primitives
from agent import prompts
from agent.llm import ReplyError, parse_reply
from agent.primitive_use import PrimitiveUseError, expand_primitive_statements
from cake_ir.io import load
from knowledge.promote import primitive as P
from tactics import get_tactic, load_tactics
from tasks.registry import get

MMA_BODY = "/roles/1/body/0/body"        # gemm_wgmma_sm90a: the consumer's K loop body


def seed(task, name):
    return copy.deepcopy(next(g for g in get(task).seed_genomes() if g["name"] == name))


def at(ir, pointer):
    node = ir
    for part in pointer.strip("/").split("/"):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def promoted(cands: list, window: list) -> types.ModuleType:
    """The module the promoter writes for the pattern of `window` over these candidates, imported."""
    key = json.dumps(P.skeleton(window), sort_keys=True, separators=(",", ":"))
    prop = P.build_proposal(P.mine(cands)[key], set(), {c["hash"]: c["ir"] for c in cands})
    name = prop.evidence["name"]
    mod = types.ModuleType(f"primitives.{name}")
    exec(compile(prop.files[f"primitives/{name}.py"], name, "exec"), mod.__dict__)
    return mod


@pytest.fixture
def wgmma_prim(monkeypatch):
    """pipe_wait_wgmma_pipe_release, from the wgmma seed and its retile child (BN 256 and 128)."""
    g = seed("gemm", "gemm_wgmma_sm90a")
    c = get_tactic("retile").apply(g, {"bn": 128, "bk": 64})
    cands = [{"hash": "seed", "ir": g["ir"], "task": "gemm", "runs": {"r1"}},
             {"hash": "bn128", "ir": c["ir"], "task": "gemm", "runs": {"r1"}}]
    mod = promoted(cands, at(g["ir"], MMA_BODY))
    assert mod.NAME == "pipe_wait_wgmma_pipe_release"
    assert mod.PARAMS == {"wgmma_b_shape_0": "int", "wgmma_id": "str"}
    monkeypatch.setitem(primitives._CACHE, "primitives", {mod.NAME: mod})
    return mod


@pytest.fixture
def no_prims(monkeypatch):
    monkeypatch.setitem(primitives._CACHE, "primitives", {})


def _use(name="pipe_wait_wgmma_pipe_release", **params):
    return {"op": "primitive", "name": name, "params": params}


# ------------------------------------------------------------------------------ the prompt
def _build(context_tokens):
    entry = get("gemm")
    g = seed("gemm", "gemm_wgmma_sm90a")
    member = {"hash": "h", "score": 1e-3, "genome": {"ir": g["ir"], "recipe": None}}
    return prompts.build(entry, member, measured=False, spec_name="sm_90a", dry_run=True, failures=[], notes=[],
                         context_tokens=context_tokens, knowledge="")


def test_prompt_has_no_primitives_section_when_none_is_accepted(no_prims):
    assert prompts.primitives_section() == ""
    msgs, meta = _build(20000)
    assert "primitives" not in meta["sections"] and '"op": "primitive"' not in msgs[1]["content"]


def test_prompt_lists_accepted_primitives_and_how_to_use_them(wgmma_prim, monkeypatch):
    text = prompts.primitives_section()
    assert text.startswith("## IR primitives")
    assert '{"op": "primitive", "name": NAME, "params": {...}}' in text
    assert "- pipe_wait_wgmma_pipe_release(wgmma_b_shape_0: int, wgmma_id: str) expands to " in text
    assert '"shape":[64,<wgmma_b_shape_0>,16]' in text and '"id":<wgmma_id>' in text   # the template, compact
    assert 'e.g. params {"wgmma_b_shape_0":256,"wgmma_id":"mma"}' in text
    assert len(text) <= prompts.PRIMITIVES_CHARS
    assert prompts.primitives_section(budget_chars=len(prompts.PRIMITIVES_HEAD) + 50) == ""   # no line fits
    msgs, meta = _build(20000)
    assert "primitives" in meta["sections"] and text in msgs[1]["content"] and not meta["over_budget"]
    # it comes before the IR reference; a budget that holds the required sections and half of it cuts it
    assert meta["sections"].index("primitives") < meta["sections"].index("ir_reference")
    monkeypatch.setattr(prompts, "ir_reference", lambda: "")
    need = _build(20000)[1]["tokens_estimate"]
    msgs, meta = _build(need)
    assert "primitives" in meta["sections"] and text in msgs[1]["content"]
    msgs, meta = _build(need - prompts.tokens(text) // 2)
    assert meta["sections"][3:] == ["primitives (cut)"] and not meta["over_budget"]


# ------------------------------------------------------------------------------ replies
def test_a_reply_using_a_primitive_parses_to_the_spliced_program(wgmma_prim):
    base = seed("gemm", "gemm_wgmma_sm90a")["ir"]
    reply = copy.deepcopy(base)
    at(reply, MMA_BODY)[0:6] = [_use(wgmma_b_shape_0=256, wgmma_id="mma")]
    program, mode = parse_reply(json.dumps({"kernel": reply}), base)
    assert mode == "program" and program == base                   # exactly the seed again
    # other parameters: the window is the primitive's expansion with them
    at(reply, MMA_BODY)[0] = _use(wgmma_b_shape_0=128, wgmma_id="mma2")
    program, _ = parse_reply(json.dumps({"kernel": reply}), base)
    assert at(program, MMA_BODY) == wgmma_prim.expand(wgmma_b_shape_0=128, wgmma_id="mma2")
    assert load(program)[0] is not None
    # in a patch's value too
    patch = [{"op": "replace", "path": MMA_BODY, "value": [_use(wgmma_b_shape_0=256, wgmma_id="mma")]}]
    program, mode = parse_reply(json.dumps({"patch": patch}), base)
    assert mode == "patch" and program == base


@pytest.mark.parametrize("stmt,needles", [
    (_use("nope", wgmma_b_shape_0=256, wgmma_id="mma"),
     ["unknown primitive 'nope'", "pipe_wait_wgmma_pipe_release(wgmma_b_shape_0: int, wgmma_id: str)"]),
    (_use(wgmma_b_shape_0=256), ["missing ['wgmma_id']", "expected pipe_wait_wgmma_pipe_release(wgmma_b_shape_0: int"]),
    (_use(wgmma_b_shape_0="256", wgmma_id="mma"), ["wgmma_b_shape_0: expected int, got str"]),
    (_use(wgmma_b_shape_0=256, wgmma_id="mma", bn=128), ["unknown ['bn']"]),
    ({"op": "primitive", "name": "pipe_wait_wgmma_pipe_release", "params": [256]}, ["must be an object"]),
    ({**_use(wgmma_b_shape_0=256, wgmma_id="mma"), "id": "x"}, ["unexpected ['id']"]),
])
def test_a_wrong_primitive_use_is_a_reply_error_naming_the_path_and_what_is_legal(wgmma_prim, stmt, needles):
    base = seed("gemm", "gemm_wgmma_sm90a")["ir"]
    reply = copy.deepcopy(base)
    at(reply, MMA_BODY)[0:6] = [stmt]
    with pytest.raises(ReplyError) as e:
        parse_reply(json.dumps({"kernel": reply}), base)
    msg = str(e.value)
    assert f"{MMA_BODY}/0:" in msg, msg
    for n in needles:
        assert n in msg, msg
    assert msg in prompts.repair_message(msg)["content"]            # the repair turn quotes it


def test_primitive_statements_in_a_program_and_with_none_accepted(wgmma_prim, monkeypatch):
    k = seed("gemm", "gemm_wgmma_sm90a")["ir"]
    doc = {"name": "p", "arch": "sm_90a", "kernels": [copy.deepcopy(k), copy.deepcopy(k)]}
    at(doc, "/kernels/1" + MMA_BODY)[0:6] = [_use(wgmma_b_shape_0=256, wgmma_id="mma")]
    out = expand_primitive_statements(doc)
    assert out["kernels"][1] == k and at(doc, "/kernels/1" + MMA_BODY)[0]["op"] == "primitive"  # input untouched
    assert expand_primitive_statements(k) is k                      # nothing to expand: the document itself
    monkeypatch.setitem(primitives._CACHE, "primitives", {})
    with pytest.raises(PrimitiveUseError, match=r"/kernels/1/roles/1/body/0/body/0: unknown primitive .*no primitives are accepted"):
        expand_primitive_statements(doc)


# ------------------------------------------------------------------------------ the search tactic
def test_primitive_variant_is_inapplicable_without_accepted_primitives(no_prims):
    t = get_tactic("primitive_variant")
    assert t in load_tactics()
    for task, name in (("gemm", "gemm_wgmma_sm90a"), ("gemm", "gemm_mma_sm80"), ("softmax", "softmax_row_n4096")):
        assert "no accepted IR primitive" in t.applicable(seed(task, name))
    assert not t.supports("sm_90a")                                 # so retrieval leaves it out of prompts


def test_primitive_variant_reinstantiates_an_occurrence(wgmma_prim):
    from tactics.primitive_variant import occurrences
    t = get_tactic("primitive_variant")
    g = seed("gemm", "gemm_wgmma_sm90a")
    occ = occurrences(g["ir"])
    assert [(o.name, o.at, o.start, o.end, o.params) for o in occ] == \
        [("pipe_wait_wgmma_pipe_release", MMA_BODY, 0, 6, {"wgmma_b_shape_0": 256, "wgmma_id": "mma"})]
    assert t.applicable(g) is None and t.supports("sm_90a")
    choices = t.choices(g)
    # the other observed value (EXAMPLES), then the double; 128 is also the half, offered once
    assert [c["params"] for c in choices] == [{"wgmma_b_shape_0": 128, "wgmma_id": "mma"},
                                              {"wgmma_b_shape_0": 512, "wgmma_id": "mma"}]
    for c in choices:
        out = t.apply(g, c)
        assert load(out["ir"])[0] is not None
        assert at(out["ir"], MMA_BODY)[0:6] == wgmma_prim.expand(**c["params"])
        assert at(out["ir"], MMA_BODY)[6:] == at(g["ir"], MMA_BODY)[6:]
        assert out["recipe"]["steps"][-1] == {"tactic": "primitive_variant", "params": c}
    # a window that no longer holds the primitive is refused (replays drop such a step)
    moved = {**choices[0], "start": 1}
    from tactics import TacticError
    with pytest.raises(TacticError, match="no occurrence"):
        t.apply(g, moved)
    # the search strategy counts it among a member's usable tactics
    from agent.search import SearchStrategy
    tactics = {x.name: x for x in load_tactics()}
    assert "primitive_variant" in [x.name for x in SearchStrategy("s", "evolve")._usable({"genome": g}, tactics)]


def test_primitive_variant_keeps_the_occurrences_own_author_ids(wgmma_prim, monkeypatch):
    monkeypatch.setattr(wgmma_prim, "EXAMPLES", [{"wgmma_b_shape_0": 64, "wgmma_id": "elsewhere"}])
    choices = get_tactic("primitive_variant").choices(seed("gemm", "gemm_wgmma_sm90a"))
    assert [c["params"] for c in choices] == [{"wgmma_b_shape_0": 64, "wgmma_id": "mma"},
                                              {"wgmma_b_shape_0": 128, "wgmma_id": "mma"},
                                              {"wgmma_b_shape_0": 512, "wgmma_id": "mma"}]


def test_primitive_variant_offers_the_other_occurrences_parameters(monkeypatch):
    """Without EXAMPLES: the values of the primitive's other occurrence in the same program."""
    from tactics.primitive_variant import occurrences
    g = seed("gemm", "gemm_mma_sm80")
    mod = promoted([{"hash": "a", "ir": g["ir"], "task": "gemm", "runs": {"r"}}],
                   at(g["ir"], "/roles/0/body/5/body")[:2])     # the two cp.async copies (prefill, main loop)
    del mod.EXAMPLES
    monkeypatch.setitem(primitives._CACHE, "primitives", {mod.NAME: mod})
    occ = occurrences(g["ir"])
    assert [(o.at, o.start) for o in occ] == [("/roles/0/body/5/body", 0), ("/roles/0/body/6/body/2/then", 0)]
    t = get_tactic("primitive_variant")
    choices = t.choices(g)
    assert [(c["at"], c["params"]) for c in choices] == [(occ[0].at, occ[1].params), (occ[1].at, occ[0].params)]
    out = t.apply(g, choices[0])
    assert at(out["ir"], occ[0].at)[0:2] == mod.expand(**occ[1].params) and load(out["ir"])[0] is not None


def test_search_proposes_primitive_variants(wgmma_prim):
    """Through the strategy's own pick, with every other tactic left out."""
    from agent.candidates import ProposeContext
    from agent.search import SearchStrategy
    from cake_ir import arch
    entry = get("gemm")
    g = seed("gemm", "gemm_wgmma_sm90a")
    st = {"pop": [{"hash": "h", "score": 1e-3, "genome": g}], "repair": [], "prior": {}}
    ctx = ProposeContext(rng=random.Random(0), seen=set(), notes=[], iteration=1, entry=entry,
                         spec=arch.spec("sm_90a"), shape=entry.bench_shape, dry_run=True, cfg=None)
    tactics = {"primitive_variant": get_tactic("primitive_variant")}
    parent, name, params, make = SearchStrategy("s", "evolve")._pick(st, tactics, ctx)
    assert name == "primitive_variant" and params["primitive"] == wgmma_prim.NAME
    assert at(make()["ir"], MMA_BODY)[0:6] == wgmma_prim.expand(**params["params"])
