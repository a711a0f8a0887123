"""Agent building blocks on the CPU: tactics, JSON Patch, strategy allocation, prompts, reply parsing,
the task registry, the CLI and the library policy (the knowledge store: test_knowledge_db.py)."""
import json
import random
import subprocess
import sys
import time

import pytest

from tactics import get_tactic, load_tactics, retrieve
from tactics.jsonpatch import PatchError, apply_patch


# ------------------------------------------------------------------------------ JSON Patch (RFC 6902)
def test_jsonpatch_rfc6902_examples():
    doc = {"foo": "bar"}
    assert apply_patch(doc, [{"op": "add", "path": "/baz", "value": "qux"}]) == {"foo": "bar", "baz": "qux"}
    assert apply_patch({"foo": ["bar", "baz"]}, [{"op": "add", "path": "/foo/1", "value": "qux"}]) == {"foo": ["bar", "qux", "baz"]}
    assert apply_patch({"foo": ["bar"]}, [{"op": "add", "path": "/foo/-", "value": "x"}]) == {"foo": ["bar", "x"]}
    assert apply_patch({"baz": "qux", "foo": "bar"}, [{"op": "remove", "path": "/baz"}]) == {"foo": "bar"}
    assert apply_patch({"baz": "qux"}, [{"op": "replace", "path": "/baz", "value": "boo"}]) == {"baz": "boo"}
    assert apply_patch({"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
                       [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}]) == \
        {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}}
    assert apply_patch({"a": [1]}, [{"op": "copy", "from": "/a", "path": "/b"}]) == {"a": [1], "b": [1]}
    assert apply_patch({"a/b": 1, "m~n": 2}, [{"op": "replace", "path": "/a~1b", "value": 3},
                                              {"op": "test", "path": "/m~0n", "value": 2}]) == {"a/b": 3, "m~n": 2}
    assert doc == {"foo": "bar"}  # the input is not modified


@pytest.mark.parametrize("patch,needle", [
    ([{"op": "replace", "path": "/nope/x", "value": 1}], "no member 'nope'"),
    ([{"op": "replace", "path": "/a/5", "value": 1}], "index 5 out of range"),
    ([{"op": "test", "path": "/b", "value": 2}], "test failed"),
    ([{"op": "frobnicate", "path": "/b"}], "unknown op"),
    ([{"op": "add", "path": "b", "value": 1}], "must start with '/'"),
    ({"op": "add"}, "array of operations"),
    ([{"op": "move", "from": "/c", "path": "/c/d"}], "own children"),
])
def test_jsonpatch_errors_name_the_operation(patch, needle):
    with pytest.raises(PatchError) as e:
        apply_patch({"a": [0], "b": 1, "c": {}}, patch)
    assert needle in str(e.value)
    if isinstance(patch, list):
        assert str(e.value).startswith("op 0 (")


# ------------------------------------------------------------------------------ tactics
def _genome(task, family):
    from tasks.registry import get
    g = next(g for g in get(task).seed_genomes() if g["name"] == family)
    return {"ir": g["ir"], "recipe": g["recipe"]}


def _verify(ir):
    from cake_ir.io import load
    from cake_ir.verifier import verify
    k, d = load(ir)
    assert k is not None, d
    return [x for x in verify(k).diagnostics if x.severity == "error"]


def test_tactic_registry_lists_the_issue_tactics():
    names = {t.name for t in load_tactics()}
    assert {"stages", "retile", "warp_split", "register_split", "vector_width", "swizzle", "unroll",
            "min_blocks", "cta_warps", "verifier_fix"} <= names
    for t in load_tactics():
        assert t.description and t.version and t.kind in ("ir", "family", "repair")


def test_stages_tactic_keeps_the_ring_consistent():
    g = _genome("gemm", "gemm_mma_sm80")
    t = get_tactic("stages")
    assert t.applicable(g) is None
    out = t.apply(g, {"S": 3})
    ir = out["ir"]
    assert ir["consts"]["S"] == 3
    assert all(b.get("stages", 1) in (1, 3) for b in ir["buffers"])
    waits = [st for _, st, _ in __import__("tactics.base", fromlist=["ops"]).ops(ir, "cp_async_wait")]
    assert sorted(w.get("n", 0) for w in waits) == [0, 1]        # main loop S-2, drain 0
    assert _verify(ir) == []
    assert out["recipe"]["steps"] == [{"tactic": "stages", "params": {"S": 3}}]
    # a second stages step replaces the first in the recipe
    assert t.apply(out, {"S": 2})["recipe"]["steps"] == [{"tactic": "stages", "params": {"S": 2}}]


def test_preconditions_explain_why_not():
    soft = _genome("softmax", "softmax_row_n4096")
    assert "const S" in get_tactic("stages").applicable(soft)
    assert "sm_90a" in get_tactic("register_split").applicable(_genome("gemm", "gemm_mma_sm80"))
    llm_written = {"ir": soft["ir"], "recipe": None}
    assert "recipe" in get_tactic("retile").applicable(llm_written)


def test_family_retile_regenerates_and_replays_ir_steps():
    g = _genome("gemm", "gemm_mma_sm80")
    g = get_tactic("unroll").apply(g, {"loop": "mainloop", "unroll": 2})
    out = get_tactic("retile").apply(g, {"bm": 64})
    ir = out["ir"]
    assert ir["consts"]["BM"] == 64 and out["recipe"]["params"]["bm"] == 64
    loop = next(st for _, st, _ in __import__("tactics.base", fromlist=["walk"]).walk(ir) if st.get("id") == "mainloop")
    assert loop["unroll"] == 2                                    # the IR step was replayed
    assert out["recipe"]["steps"][0]["tactic"] == "unroll"
    assert _verify(ir) == []


def test_every_tactic_choice_yields_a_loadable_program():
    from cake_ir.io import load
    for task, fam in (("gemm", "gemm_mma_sm80"), ("gemm", "gemm_wgmma_sm90a"), ("softmax", "softmax_row_n4096")):
        g = _genome(task, fam)
        for t in load_tactics():
            if t.applicable(g) is not None:
                continue
            for p in t.choices(g)[:6]:
                out = t.apply(g, p)
                assert load(out["ir"])[0] is not None, (t.name, p)


def test_verifier_fix_applies_a_diagnostic_patch():
    g = _genome("softmax", "softmax_row_n4096")
    bad = apply_patch(g["ir"], [{"op": "replace", "path": "/buffers/0/vec", "value": 1},
                                {"op": "replace", "path": "/buffers/1/vec", "value": 1}])
    errs = _verify(bad)
    assert errs and errs[0].code == "E-CPY-04" and errs[0].fix
    g2 = {"ir": bad, "recipe": None, "diagnostics": [e.model_dump() for e in errs]}
    t = get_tactic("verifier_fix")
    assert t.applicable(g2) is None
    choices = t.choices(g2)
    assert choices[0]["code"] == "all" and len(choices) == 1 + len(errs)      # each fix, and all of them at once
    assert _verify(t.apply(g2, choices[0])["ir"]) == []
    one = _verify(t.apply(g2, choices[1])["ir"])
    assert len(one) == len(errs) - 1


def test_retrieval_prefers_matching_tactics():
    assert retrieve("E-RES-01 shared memory needs too many bytes; stages", k=2)[0].name == "stages"
    assert "register_split" in [t.name for t in retrieve("E-RES-03 roles claim registers setmaxnreg", k=2)]


# ------------------------------------------------------------------------------ strategies
def test_allocation_shifts_effort_to_the_improving_strategy():
    from agent.strategies import allocate, new_strategy_state, observe
    sts = {"bandit": new_strategy_state("bandit", "search"), "evolve": new_strategy_state("evolve", "search")}
    sts["bandit"]["best_s"] = sts["evolve"]["best_s"] = 1.0
    events = []
    for i in range(10):   # evolve keeps failing, bandit keeps improving
        events += observe(sts["evolve"], {"hash": f"e{i}", "status": "failed", "tactic": "stages", "stage": "verify"}, plateau=4)
        events += observe(sts["bandit"], {"hash": f"b{i}", "status": "ok", "score_s": 0.9 ** (i + 1), "parent_score": 1.0,
                                          "tactic": "retile", "ir": {}, "recipe": None}, plateau=4)
    assert sts["evolve"]["plateau"] and not sts["bandit"]["plateau"]
    assert any("plateau: evolve" in e for e in events)
    total = {"bandit": 0, "evolve": 0}
    for _ in range(20):
        for n, k in allocate(sts, 2, plateau=4).items():
            total[n] += k
    assert total["bandit"] + total["evolve"] == 40
    assert total["bandit"] >= 30 and total["evolve"] >= 1        # shifted, but the plateaued one is not starved
    assert sts["bandit"]["arms"]["retile"][0] == 10 and sts["evolve"]["arms"]["stages"] == [10, 0.0]


def test_search_proposals_are_new_ranked_and_deterministic():
    from agent.candidates import ProposeContext
    from agent.search import SearchStrategy
    from agent.strategies import member_of, new_strategy_state
    from cake_ir import arch
    from tasks.registry import get
    entry = get("gemm")

    def run():
        st = new_strategy_state("bandit", "search")
        for g in entry.seed_genomes():
            st["pop"].append(member_of({"hash": g["name"], "name": g["name"], "score_s": 1e-3, "ir": g["ir"],
                                        "recipe": g["recipe"]}))
        ctx = ProposeContext(rng=random.Random(7), seen=set(), notes=[], iteration=1, entry=entry,
                             spec=arch.spec("sm_90a"), shape=entry.bench_shape, dry_run=True)
        return SearchStrategy("bandit", "bandit").propose(st, 3, ctx)[0]

    a, b = run(), run()
    assert [c["hash"] for c in a] == [c["hash"] for c in b] and len(a) == 3
    assert len({c["hash"] for c in a}) == 3
    assert all(c["tactic"] and c["parent"] and c["predicted_s"] for c in a)


# ------------------------------------------------------------------------------ prompts and replies
def test_prompt_respects_the_context_budget():
    from agent import prompts
    from tasks.registry import get
    entry = get("softmax")
    g = entry.seed_genomes()[0]
    member = {"hash": "h1", "score": 7e-5, "genome": {"ir": g["ir"], "recipe": None}}
    failures = [{"hash": "h2", "tactic": "llm_patch", "stage": "verify", "code": "E-CPY-04",
                 "diagnostics": [{"code": "E-CPY-04", "node": "/roles/0/body/0/vec_bytes", "message": "too wide",
                                  "legal": [2], "fix": [{"op": "replace", "path": "/roles/0/body/0/vec_bytes", "value": 2}]}],
                 "ir": g["ir"]}]
    big, meta_big = prompts.build(entry, member, measured=False, spec_name="sm_90a", dry_run=True, failures=failures,
                                  notes=[{"strategy": "bandit", "text": "stages {S=3}: -3%"}], context_tokens=20000)
    assert meta_big["sections"][:3] == ["task", "base", "format"] and "ir_reference" in meta_big["sections"]
    text = big[1]["content"]
    assert "E-CPY-04 at /roles/0/body/0/vec_bytes" in text and "IR around the node" in text
    assert "## Tactics that may apply" in text and "stages {S=3}" in text
    small, meta = prompts.build(entry, member, measured=False, spec_name="sm_90a", dry_run=True, failures=failures,
                                notes=[], context_tokens=2500)
    assert not meta["over_budget"] and meta["tokens_estimate"] <= 2500
    assert "ir_reference" not in meta["sections"]
    assert json.dumps(g["ir"], separators=(",", ":")) in small[1]["content"]   # the base IR always goes in


def test_parse_reply_forms_and_errors():
    from agent.llm import ReplyError, parse_reply
    from tasks.registry import get
    ir = get("softmax").seed_genomes()[0]["ir"]
    p, mode = parse_reply('```json\n{"patch": [{"op": "replace", "path": "/launch/threads", "value": 128}]}\n```', ir)
    assert mode == "patch" and p["launch"]["threads"] == 128
    p, mode = parse_reply(json.dumps({"kernel": ir, "why": "same"}), ir)
    assert mode == "program" and p == ir
    assert parse_reply(json.dumps([{"op": "remove", "path": "/note"}]), ir)[1] == "patch"
    for text, needle in [("no json here", "not valid JSON"), ('{"answer": 1}', "expected {\"patch\""),
                         ('{"patch": [{"op": "remove", "path": "/nothing"}]}', "does not apply"),
                         (json.dumps({"kernel": {**ir, "arch": "sm_99"}}), "schema")]:
        with pytest.raises(ReplyError) as e:
            parse_reply(text, ir)
        assert needle in str(e.value)


# ------------------------------------------------------------------------------ registry and CLI
def test_registry_discovers_tasks_with_baselines_and_seeds():
    from tasks.registry import discover, get
    found = discover()
    assert {"gemm", "softmax"} <= {n for n, e in found.items() if e.runnable}
    e = get("gemm")
    assert e.baselines[0]["name"] == "torch.matmul" and e.shape_key() == "M4096_N4096_K4096"
    assert {g["name"] for g in e.seed_genomes()} == {"gemm_mma_sm80", "gemm_wgmma_sm90a"}
    with pytest.raises(KeyError):
        get("nope")


def test_cli_help_is_fast_and_lists_tasks():
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "agent.run", "--help"], capture_output=True, text=True, timeout=30)
    dt = time.perf_counter() - t0
    assert p.returncode == 0 and "--resume" in p.stdout and "--dry-run" in p.stdout
    assert dt < 1.0, f"--help took {dt:.2f} s"
    p = subprocess.run([sys.executable, "-m", "agent.run", "--list-tasks"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    assert "gemm" in p.stdout and "softmax" in p.stdout and "torch.matmul" in p.stdout
    p = subprocess.run([sys.executable, "-m", "agent.run", "--task", "nope", "--dry-run"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "unknown task" in p.stderr


def test_progress_redraws_on_a_terminal_and_prints_lines_otherwise():
    import io

    from agent.progress import Progress
    snap = {"run": "r", "task": "gemm", "iteration": 3, "n_proposed": 8, "max": 30, "dry_run": True,
            "funnel": {"proposed": 8, "verify": 6, "compile": 5}, "failures_by_code": {"E-RES-01": 2},
            "best": {"score_s": 1.9e-4, "measured": False, "speedup": 1.1, "speedup_vs": "best seed (predicted)",
                     "name": "k", "hash": "abcdef0123"},
            "strategies": {"bandit": {"weight": 0.8, "best_s": 1.9e-4}, "evolve": {"weight": 0.2, "plateau": True}},
            "workers": {"kind": "local", "compile_workers": 2}, "elapsed_s": 12, "node": "reflect"}
    tty = io.StringIO()
    p = Progress(stream=tty, tty=True)
    p.update(snap)
    p.update({**snap, "node": "verify"})
    p.event("plateau: evolve")
    out = tty.getvalue()
    assert "\x1b[" in out and out.count("CAKE r") == 3          # redrawn in place, and after the event line
    assert "predicted, unmeasured" in out and "E-RES-01 2" in out and "evolve 20% best - plateau" in out
    plain = io.StringIO()
    p = Progress(stream=plain, tty=False)
    p.update({**snap, "node": "verify"})                          # mid-step updates are not printed
    p.update(snap)
    p.event("plateau: evolve")
    lines = plain.getvalue().splitlines()
    assert "\x1b[" not in plain.getvalue() and len(lines) == 2
    assert lines[0].startswith("[r] it 3 cand 8/30") and "compile 5" in lines[0] and "GPU none (dry run" in lines[0]


def test_library_replacement_policy():
    from agent.library import _should_replace
    dry = {"hash": "a", "measured": False, "seconds": 1e-3, "target": "h200", "device": None}
    meas = {"hash": "b", "measured": True, "seconds": 2e-3, "device": "H200", "target": None}
    assert _should_replace(None, dry)[0]
    assert _should_replace(dry, meas)[0]                            # measured beats predicted
    assert not _should_replace(meas, {**dry, "hash": "c"})[0]        # a dry run never replaces a measurement
    assert _should_replace(meas, {**meas, "hash": "d", "seconds": 1e-3})[0]
    assert not _should_replace(meas, {**meas, "hash": "e", "seconds": 3e-3})[0]
    assert _should_replace(meas, {**meas, "hash": "f", "seconds": 3e-3, "device": "A100"})[0]


def test_job_deadline_defaults_to_the_tasks_need():
    """agent.run's watchdog deadline: --deadline if given, else 90 s raised to the task's job_seconds
    (kda's bench inputs and float64 reference take tens of seconds on a worker's first profile job)."""
    from agent.run import _deadline, parser
    assert _deadline(parser().parse_args(["--task", "kda"])) == 120.0
    assert _deadline(parser().parse_args(["--task", "softmax"])) == 90.0
    assert _deadline(parser().parse_args(["--task", "kda", "--deadline", "45"])) == 45.0


def test_dry_run_compile_job_predicts_from_the_compiled_code():
    """compile_job with sass_cost (what a dry run sends) adds the SASS-count prediction where nvdisasm is
    installed; without sass_cost it does not compile twice."""
    import pytest
    from cake_ir.analysis.sass import find_nvdisasm
    from cake_ir.io import load_file, to_dict
    from agent.jobs import compile_job
    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed")
    k, _ = load_file("tasks/softmax/seeds/softmax_row_n4096.json")
    shape = {"M": 4096, "N": 4096}
    rec = compile_job({"ir": to_dict(k), "name": "x", "sass_cost": {"shape": shape, "target": "h200"}})
    assert rec["status"] == "ok"
    assert rec["compile"]["sass_instructions"] > 10 and rec["compile"]["predicted_sass_s"] > 0
    plain = compile_job({"ir": to_dict(k), "name": "x"})
    assert "predicted_sass_s" not in plain["compile"]
