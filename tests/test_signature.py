"""Failure signatures: message templates, node kinds, IR features."""
import json
import pathlib

from knowledge.signature import node_kind, signature, template
from rules._features import describe, features, match

ROOT = pathlib.Path(__file__).resolve().parent.parent
WGMMA = json.loads((ROOT / "tasks/gemm/seeds/gemm_wgmma_sm90a.json").read_text())
SOFTMAX = json.loads((ROOT / "tasks/softmax/seeds/softmax_row_n4096.json").read_text())


def test_template_abstracts_names_numbers_paths_but_keeps_codes():
    t = template("ptxas error C7602 in /tmp/x1/cake.cu(123): entry 'k_12' of gemm_wgmma_128x256x64_s4 "
                 "uses 0x1f00 bytes, hash 3fa2c1d0aa11bb22, at /roles/1/regs on sm_90a (E-RES-05): 2.5e-3")
    assert t == ("ptxas error C7602 in <path>: entry <name> of <id> uses <hex> bytes, hash <hex>, at <ptr> "
                 "on sm_90a (E-RES-05): <n>")
    assert template("stg with 16-byte vectors: each thread's run is 4 bytes (tile 'acc')") == \
        "stg with <n>-byte vectors: each thread's run is <n> bytes (tile <name>)"
    assert template("tile of 4096 elements does not split into 1024 threads x 8-element chunks") == \
        template("tile of 2048 elements does not split into 512 threads x 16-element chunks")


def test_node_kind_resolves_pointer_in_the_candidate_ir():
    assert node_kind(WGMMA, "/roles/1/body/0/body/2") == "wgmma"
    assert node_kind(WGMMA, "/roles/1/body/1/vec_bytes") == "stg.vec_bytes"
    assert node_kind(WGMMA, "/buffers/2") == "buffer"
    assert node_kind(WGMMA, "/params/3/tma/box/1") == "param.tma.box"
    assert node_kind(WGMMA, "/roles/1/regs") == "role.regs"
    assert node_kind(WGMMA, "/roles/7/body") is None
    assert node_kind(None, "/roles/0") is None and node_kind(WGMMA, None) is None


def test_same_mistake_same_signature_different_mistake_different():
    a = signature("compile", "E-LOWER-UNSUPPORTED", "tile of 4096 elements does not split into 1024 threads",
                  "/roles/0/body/0", SOFTMAX)
    b = signature("compile", "E-LOWER-UNSUPPORTED", "tile of 8192 elements does not split into 512 threads",
                  "/roles/0/body/0", {**SOFTMAX, "name": "other"})
    assert a[0] == b[0] and a[1] == "ldg" and a[2] == b[2]
    assert signature("test", "E-LOWER-UNSUPPORTED", "tile of 1 elements does not split into 2 threads",
                     "/roles/0/body/0", SOFTMAX)[0] != a[0]                       # other stage
    assert signature("compile", "E-LOWER-UNSUPPORTED", "tile of 1 elements does not split into 2 threads",
                     "/roles/0/body/0", {**SOFTMAX, "arch": "sm_80"})[0] != a[0]   # other arch
    # a proposer failure has no IR: no node kind, no features, still a signature
    sig, kind, tmpl, feats = signature("propose", "E-PROPOSER-REPLY", "reply 3 is not JSON", None, None)
    assert len(sig) == 16 and kind is None and feats == {} and tmpl == "reply <n> is not JSON"


def test_features_of_the_seeds():
    f = features(WGMMA)
    assert f["arch"] == "sm_90a" and f["threads"] == 384 and f["roles"] == 2
    assert (f["regs_min"], f["regs_max"]) == (40, 232) and f["launch_reg_cap"] == 168
    assert f["op:wgmma"] == 1 and (f["wgmma_m"], f["wgmma_n"], f["wgmma_k"]) == (64, 256, 16)
    assert f["copy:tma_load"] == 2 and f["pipeline_stages_max"] == 4 and f["const:BN"] == 256
    assert f["smem_bytes"] == 4 * (128 * 64 + 256 * 64) * 2
    assert f["reg_tile_words_max"] == 128          # a 64x256 f32 accumulator over a warpgroup
    s = features(SOFTMAX)
    assert s["blocked_chunk_elems"] == 256 * 8 and s["blocked_even"] is True and "op:wgmma" not in s
    assert features("not a kernel") == {} and features({"roles": "garbage"})["arch"] == "?"


def test_predicates_are_conjunctions_and_missing_features_never_match():
    f = features(WGMMA)
    assert match([["arch", "==", "sm_90a"], ["threads", ">=", 384]], f)
    assert not match([["arch", "==", "sm_90a"], ["threads", ">", 384]], f)
    assert not match([["no_such_feature", "<=", 1]], f)
    assert not match([], f)                        # an empty predicate matches nothing
    assert describe([["threads", ">=", 512]]) == "threads >= 512"
