"""Scenario tests for the synchronisation rules (E-SYN-*, E-PIP-*) and cake_ir.analysis.sync: correct
variants of the fixture kernels stay clean, one-bug variants trip the intended rule, every fix patch
repairs its failing fixture, and no rule raises on mangled kernels."""
import copy
import json
import pathlib
import time

import pytest

from cake_ir.io import load
from cake_ir.verifier import load_rules, verify

FIX = pathlib.Path(__file__).resolve().parent.parent / "rules" / "fixtures"
SYNC_CODES = sorted(r.code for r in load_rules() if r.family in ("SYN", "PIP"))


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    from cake_ir.analysis import sync
    monkeypatch.setattr(sync, "STRICT", True)  # analysis bugs raise here instead of silencing the rule


def _doc(code, which="pass"):
    return json.loads((FIX / code / f"{which}.json").read_text())


def tma_explicit():
    return _doc("E-SYN-02")["kernel"]


def tma_pipeline():
    return _doc("E-PIP-01")["kernel"]


def cp_async_sm80():
    return _doc("E-SYN-06")["kernel"]


def cp_async_pipeline_sm80():
    """Warp-specialised sm_80 GEMM: a cp.async producer warp feeds 4 mma.sync consumer warps through a
    3-stage cp_async pipeline (full = 32 cp.async.mbarrier.arrive, empty = one lane per consumer warp)."""
    k = cp_async_sm80()
    k = copy.deepcopy(k)
    k["name"] = "gemm_cp_async_pipeline_sm80"
    k["launch"]["threads"] = 160
    k["buffers"] = [b for b in k["buffers"] if b["name"] not in ("sC", "out")]
    for b in k["buffers"]:
        if b["space"] == "reg":
            b["role"] = "consumer"
    k["pipelines"] = [{"name": "ab", "stages": 3, "mechanism": "cp_async", "producer": "producer",
                       "consumers": ["consumer"], "buffers": ["sA", "sB"]}]
    lets = [{"op": "let", "name": "m0", "value": "bid.y * BM"}, {"op": "let", "name": "n0", "value": "bid.x * BN"}]
    consumer = {"name": "consumer", "warps": [0, 4], "body": lets + [
        {"op": "let", "name": "wm", "value": "32 * (role_warp / 2)"},
        {"op": "let", "name": "wn", "value": "32 * (role_warp % 2)"},
        {"op": "fill", "dst": {"buf": "acc"}, "value": 0.0},
        {"op": "for", "var": "kt", "stop": "K / BK", "body": [
            {"op": "pipe_wait", "pipe": "ab", "iter": "kt"},
            {"op": "for", "var": "kk", "stop": 32, "step": 16, "unroll": True, "body": [
                {"op": "ldmatrix", "src": {"buf": "sA", "slot": "kt % S", "offset": ["wm", "kk"], "shape": [32, 16]},
                 "dst": {"buf": "af"}},
                {"op": "ldmatrix", "src": {"buf": "sB", "slot": "kt % S", "offset": ["wn", "kk"], "shape": [32, 16]},
                 "dst": {"buf": "bf"}},
                {"op": "mma_sync", "a": {"buf": "af"}, "b": {"buf": "bf"}, "c": {"buf": "acc"}}]},
            {"op": "pipe_release", "pipe": "ab", "iter": "kt"}]},
        {"op": "stg", "src": {"buf": "acc"}, "dst": {"buf": "C", "offset": ["m0 + wm", "n0 + wn"], "shape": [32, 32]},
         "vec_bytes": 8}]}
    producer = {"name": "producer", "warps": [4, 1], "body": lets + [
        {"op": "for", "var": "kt", "stop": "K / BK", "body": [
            {"op": "pipe_acquire", "pipe": "ab", "iter": "kt"},
            {"op": "copy", "kind": "cp_async", "src": {"buf": "A", "offset": ["m0", "kt * BK"], "shape": [64, 32]},
             "dst": {"buf": "sA", "slot": "kt % S"}},
            {"op": "copy", "kind": "cp_async", "src": {"buf": "B", "offset": ["n0", "kt * BK"], "shape": [64, 32]},
             "dst": {"buf": "sB", "slot": "kt % S"}},
            {"op": "pipe_commit", "pipe": "ab", "iter": "kt"}]}]}
    k["roles"] = [consumer, producer]
    return k


def _verify(kdoc):
    k, diags = load(kdoc)
    assert k is not None, [d.short() for d in diags]
    res = verify(k)
    assert not any(d.code == "E-VERIFY-INTERNAL" for d in res.diagnostics), [d.short() for d in res.diagnostics]
    return res


def _errors(res, family=("SYN", "PIP")):
    return [d for d in res.diagnostics if d.severity == "error" and d.code.split("-")[1] in family]


def _at(doc, path):
    cur = doc
    for p in path.strip("/").split("/"):
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    return cur


def _patch(doc, ops):
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = op["path"].strip("/").split("/")
        par = _at(doc, "/" + "/".join(parts[:-1])) if len(parts) > 1 else doc
        last = parts[-1]
        if op["op"] == "add":
            if isinstance(par, list):
                par.append(op["value"]) if last == "-" else par.insert(int(last), op["value"])
            else:
                par[last] = op["value"]
        elif op["op"] == "replace":
            par[int(last) if isinstance(par, list) else last] = op["value"]
        elif op["op"] == "remove":
            del par[int(last) if isinstance(par, list) else last]
    return doc


C_LOOP = "/roles/1/body/2"
P_LOOP = "/roles/0/body/2/then/0"


# ------------------------------------------------------------------------------- clean variants
def test_cp_async_pipeline_is_clean():
    res = _verify(cp_async_pipeline_sm80())
    assert not [d for d in res.diagnostics if d.severity == "error"], [d.short() for d in res.diagnostics]


def test_explicit_deferred_release_is_clean():
    k = tma_explicit()
    body = _at(k, C_LOOP + "/body")
    body[4]["n"] = 1
    body[5] = {"op": "if", "cond": "kt > 0", "then": [{"op": "if", "cond": "lane == 0", "then": [
        {"op": "mbar_arrive", "barrier": {"name": "empty", "index": "(kt - 1) % S"}}]}]}
    k["roles"][1]["body"].insert(3, {"op": "wgmma_wait", "n": 0})
    res = _verify(k)
    assert not _errors(res), [d.short() for d in res.diagnostics]


def test_two_consumer_warpgroups_clean():
    k = tma_pipeline()
    k["launch"]["threads"] = 384
    k["consts"]["BM"] = 128
    k["roles"][1]["warps"] = [4, 8]
    k["params"][0]["tma"]["box"] = [128, 64]
    k["buffers"][0]["shape"] = [128, 64]
    _at(k, P_LOOP + "/body/1/src")["shape"] = [128, 64]
    _at(k, C_LOOP + "/body/2/a").update({"offset": ["64 * wg", 0], "shape": [64, 64]})
    k["roles"][1]["body"][-1]["dst"]["offset"] = ["m0 + 64 * wg", "n0"]
    res = _verify(k)
    assert not _errors(res), [d.short() for d in res.diagnostics]


def test_role_warp_guard_covering_all_threads_is_not_divergent():
    k = cp_async_sm80()
    k["roles"][0]["body"][9] = {"op": "if", "cond": "role_warp < 4", "then": [{"op": "syncthreads"}]}
    res = _verify(k)
    assert not [d for d in res.diagnostics if d.code == "E-SYN-09"]


# ------------------------------------------------------------------------------- buggy variants
def _codes_at(res, code):
    return {d.node for d in res.diagnostics if d.code == code}


def test_producer_without_empty_wait_races():
    k = tma_explicit()
    del _at(k, P_LOOP + "/body")[0]
    res = _verify(k)
    assert P_LOOP + "/body/1" in _codes_at(res, "E-SYN-10") or P_LOOP + "/body/2" in _codes_at(res, "E-SYN-10")


def test_release_before_wgmma_wait():
    k = tma_explicit()
    body = _at(k, C_LOOP + "/body")
    body[4], body[5] = body[5], body[4]
    res = _verify(k)
    assert C_LOOP + "/body/4/then/0" in _codes_at(res, "E-SYN-07"), [d.short() for d in res.diagnostics]


def test_empty_wait_with_full_parity():
    k = tma_explicit()
    _at(k, P_LOOP + "/body/0")["parity"] = "(kt / S) % 2"
    res = _verify(k)
    hits = [d for d in res.diagnostics if d.code == "E-SYN-04" and d.node == P_LOOP + "/body/0"]
    assert hits and hits[0].legal == "(kt / S + 1) % 2", [d.short() for d in hits]


def test_cp_async_commit_by_one_thread():
    k = cp_async_pipeline_sm80()
    loop = k["roles"][1]["body"][2]["body"]
    loop[3] = {"op": "if", "cond": "role_tid == 0", "then": [loop[3]]}
    res = _verify(k)
    assert any(d.code == "E-SYN-02" and d.legal == 1 for d in res.diagnostics), [d.short() for d in res.diagnostics]


def test_cp_async_pipeline_release_missing():
    k = cp_async_pipeline_sm80()
    del k["roles"][0]["body"][5]["body"][2]
    res = _verify(k)
    assert "/roles/0/body/5/body/0" in _codes_at(res, "E-PIP-02")


def test_divergent_syncthreads():
    k = cp_async_sm80()
    k["roles"][0]["body"][9] = {"op": "if", "cond": "lane < 16", "then": [{"op": "syncthreads"}]}
    res = _verify(k)
    assert "/roles/0/body/9/then/0" in _codes_at(res, "E-SYN-09")


def test_wgmma_without_fence():
    k = tma_explicit()
    del _at(k, C_LOOP + "/body")[1]
    res = _verify(k)
    assert C_LOOP + "/body/1" in _codes_at(res, "E-SYN-07")


def test_acc_read_before_final_wait():
    k = tma_pipeline()
    del k["roles"][1]["body"][3]  # the wgmma_wait 0 after the loop
    res = _verify(k)
    assert any(d.code == "E-PIP-04" for d in res.diagnostics), [d.short() for d in res.diagnostics]


def test_missing_prologue_fence():
    k = tma_explicit()
    del k["prologue"][1]
    res = _verify(k)
    d = [d for d in res.diagnostics if d.code == "E-SYN-01"]
    assert d and d[0].fix, [x.short() for x in d]


# ------------------------------------------------------------------------------- fixes repair
@pytest.mark.parametrize("code", SYNC_CODES)
def test_fix_repairs_fixture(code):
    doc = _doc(code, "fail")
    res = _verify(doc["kernel"])
    hit = next(d for d in res.diagnostics if d.code == code and d.node == doc["expect"]["node"])
    if not hit.fix:
        pytest.skip("no fix for this diagnostic")
    res2 = _verify(_patch(doc["kernel"], hit.fix))
    assert not [d for d in res2.diagnostics if d.code == code and d.node == hit.node], \
        [d.short() for d in res2.diagnostics]


# ------------------------------------------------------------------------------- robustness, speed
def _all_stmt_paths(doc):
    out = []

    def rec(body, path):
        for i, st in enumerate(body):
            p = f"{path}/{i}"
            out.append(p)
            for f in ("body", "then", "else"):
                if isinstance(st.get(f), list):
                    rec(st[f], f"{p}/{f}")
    rec(doc.get("prologue", []), "/prologue")
    for ri, r in enumerate(doc["roles"]):
        rec(r["body"], f"/roles/{ri}/body")
    return out


@pytest.mark.parametrize("base", [tma_explicit, tma_pipeline, cp_async_sm80, cp_async_pipeline_sm80])
def test_no_rule_raises_on_deleted_statements(base):
    k = base()
    for path in _all_stmt_paths(k):
        _verify(_patch(k, [{"op": "remove", "path": path}]))


def test_fast_enough():
    k, _ = load(tma_pipeline())
    verify(k)
    t = time.perf_counter()
    for _ in range(5):
        verify(k)
    assert (time.perf_counter() - t) / 5 < 0.1


def test_two_warpgroups_store_their_own_halves():
    """Each consumer warpgroup issues its own TMA store (one elected thread per warpgroup, offset 64 * wg):
    two issuing threads, but distinct operations -- not an E-SYN-05."""
    k = tma_explicit()
    k["launch"]["threads"] = 384
    k["consts"]["BM"] = 128
    k["params"][0]["tma"]["box"] = [128, 64]
    k["buffers"][0]["shape"] = [128, 64]
    k["buffers"][2]["shape"] = [128, 128]
    k["barriers"][1]["arrivals"] = 8
    k["barriers"][2]["threads"] = 256
    k["prologue"][0]["then"][0]["body"][1]["arrivals"] = 8
    k["roles"][1]["warps"] = [4, 8]
    _at(k, P_LOOP + "/body/1")["bytes"] = 32768
    _at(k, P_LOOP + "/body/2/src")["shape"] = [128, 64]
    _at(k, C_LOOP + "/body/2/a").update({"offset": ["64 * wg", 0], "shape": [64, 64]})
    body = k["roles"][1]["body"]
    body[3]["dst"].update({"offset": ["64 * wg", 0], "shape": [64, 128]})
    body[6] = {"op": "if", "cond": "wg_tid == 0", "then": [
        {"op": "copy", "kind": "tma_store", "src": {"buf": "sC", "offset": ["64 * wg", 0], "shape": [64, 128]},
         "dst": {"buf": "C", "offset": ["m0 + 64 * wg", "n0"], "shape": [64, 128]}},
        {"op": "tma_store_commit"}, {"op": "tma_store_wait", "n": 0}]}
    res = _verify(k)
    assert not _errors(res), [d.short() for d in res.diagnostics]
    # the same with one shared offset is a duplicated store
    body[6]["then"][0]["src"]["offset"] = [0, 0]
    body[6]["then"][0]["dst"]["offset"] = ["m0", "n0"]
    res = _verify(k)
    assert "/roles/1/body/6/then/0" in _codes_at(res, "E-SYN-05")


def test_per_warp_trip_count_is_simulated():
    """The KDA prepare kernel's chunk loop strides by warp (`cz = bid.z * PW + role_warp`), so its trip
    count differs between warps. The simulator used to give up on it silently (N-SYN-01 now says when
    it gives up); it runs each iteration with the warps still in the loop: the kernel verifies clean,
    and a syncwarp taken out of the loop body is reported."""
    from cake_ir import io
    from cake_ir.nodes import Kernel
    prog, _ = io.load_file(str(FIX.parent.parent / "tasks" / "kda" / "seeds" / "kda_two_pass_safe_sm90a.json"))
    prep = prog.kernels[0]
    res = verify(prep)
    assert not [d for d in res.diagnostics if d.severity == "error" or d.code == "N-SYN-01"], \
        [d.short() for d in res.diagnostics]
    doc = prep.model_dump(exclude_none=True)
    loop = next(s for s in doc["roles"][0]["body"] if s.get("op") == "for" and "role_warp" not in str(s.get("stop")))
    assert "nbid.z * PW" in str(loop["stop"])               # the per-warp strided loop
    i = next(i for i, s in enumerate(loop["body"]) if s["op"] == "syncwarp")
    del loop["body"][i]
    bad = verify(Kernel.model_validate(doc))   # (this one orders a cp.async's landing for the other lanes)
    assert [d for d in bad.diagnostics if d.code == "E-SYN-06"], [d.short() for d in bad.diagnostics]
