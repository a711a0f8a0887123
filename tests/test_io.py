import json
import pathlib

import pytest

from cake_ir import io
from cake_ir.walk import resolve, statements

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEEDS = sorted(ROOT.glob("tasks/*/seeds/*.json"))


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.stem)
def test_round_trip_is_lossless(path):
    text = path.read_text()
    k, diags = io.load(text)
    assert k is not None, diags
    assert json.loads(io.dumps(k)) == json.loads(text)
    k2, _ = io.load(io.dumps(k))
    assert k2 == k and io.ir_hash(k2) == io.ir_hash(k)


def test_every_statement_path_resolves_in_the_json():
    doc = json.loads(SEEDS[0].read_text())
    k, _ = io.load(doc)
    for site in statements(k):
        raw = resolve(doc, site.path)
        assert isinstance(raw, dict) and raw["op"] == site.node.op


def test_malformed_json_reports_line_and_column():
    k, diags = io.load('{"name": "k",\n "arch": "sm_90a", ')
    assert k is None and diags[0].code == "E-PARSE-JSON" and "line 2" in diags[0].message


def test_schema_violation_names_the_node_path():
    doc = json.loads(SEEDS[0].read_text())
    doc["roles"][0]["body"][0]["vec_bytes"] = 3
    k, diags = io.load(doc)
    assert k is None
    assert any(d.node == "/roles/0/body/0/vec_bytes" for d in diags), [d.short() for d in diags]


def test_unknown_op_and_bad_identifier():
    doc = json.loads(SEEDS[0].read_text())
    doc["roles"][0]["body"].append({"op": "launch_missiles"})
    doc["buffers"][0]["name"] = "x*/ #include"
    k, diags = io.load(doc)
    assert k is None
    paths = {d.node for d in diags}
    assert "/buffers/0/name" in paths
    assert any(p.startswith(f"/roles/0/body/{len(doc['roles'][0]['body']) - 1}") for p in paths)


def test_expression_syntax_errors_are_schema_errors_with_paths():
    doc = json.loads(SEEDS[0].read_text())
    doc["launch"]["grid"][0] = "M +"
    k, diags = io.load(doc)
    assert k is None and diags[0].node == "/launch/grid/0" and "expected" in diags[0].message or "unexpected" in diags[0].message


def test_hash_ignores_spelled_out_defaults():
    doc = json.loads(SEEDS[0].read_text())
    k1, _ = io.load(doc)
    doc["launch"]["min_blocks_per_sm"] = 1
    k2, _ = io.load(doc)
    assert io.ir_hash(k1) == io.ir_hash(k2)


def test_json_schema_exports():
    s = io.json_schema()
    assert s["title"] == "Kernel" and "roles" in s["properties"]
    json.dumps(s)
