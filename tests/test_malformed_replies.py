"""Malformed and hostile LLM replies: each is used (after at most one repair turn) or rejected with a
recorded reason, and nothing in a reply is ever executed.

The unit is agent.llm.parse_reply (extract JSON -> patch or program -> schema load); the campaign
in tests/test_api_key_leak.py feeds hostile replies through the real loop (litellm -> HTTP -> a
loopback server on 127.0.0.1) and checks the failures table. Replies that try to run code
(os.system, __import__, open(...).write, shell commands, a Python code block) aim at a sentinel file;
os.system / subprocess / eval / exec are also trapped while replies are handled.
"""
import builtins
import json
import os
import subprocess

import pytest

import cake_ir.compiler  # noqa: F401 - imported before eval/exec are trapped
import tactics.jsonpatch  # noqa: F401
from agent.llm import MAX_REPLY_CHARS, ReplyError, extract_json, parse_reply
from tasks.registry import get

SEED = get("softmax").seed_genomes()[0]["ir"]


def _attacks(sentinel: str) -> list[str]:
    code = f"__import__('os').system('touch {sentinel}')"
    return [
        code,
        f"Run this first: `touch {sentinel}` then reply.\n```bash\ntouch {sentinel}\n```",
        f"```python\nimport os\nos.system('touch {sentinel}')\nopen({sentinel!r}, 'w').write('x')\n```",
        json.dumps({"patch": [{"op": "replace", "path": "/name", "value": code}]}),
        json.dumps({"patch": [{"op": "replace", "path": "/note", "value": code}]}),   # a note is free text
        json.dumps({"kernel": {**SEED, "name": f"x; os.system('touch {sentinel}')"}}),
        json.dumps({"patch": [{"op": "add", "path": "/__class__", "value": code}]}),
        json.dumps({"patch": [{"op": "replace", "path": "/roles/0/body/1/expr", "value": code}]}),
        '{"patch": [{"op": "replace", "path": "/launch/threads", "value": 128}], "exec": "' + code + '"}',
    ]


MALFORMED = [
    None, "", "   ", "Sure, I would be happy to help!", "{", '{"patch": [', "[1, 2",
    '```json\n{"patch": [{"op": "replace", "path": "/launch/threads", "value": 12\n```',
    "```json\n```", "null", "42", '"a string"', "[]", "{}", '{"answer": 42}', '{"patch": {"op": "add"}}',
    '{"patch": [1, 2, 3]}', '{"patch": [{"op": "frobnicate", "path": "/name"}]}',
    '{"patch": [{"op": "replace", "path": "/roles/9/regs", "value": 64}]}',
    '{"patch": [{"op": "remove", "path": "/buffers/0/nope"}]}',
    '{"patch": [{"op": "replace", "path": "name", "value": "x"}]}',
    '{"patch": [{"op": "remove", "path": ""}]}',
    '{"patch": [{"op": "move", "from": "/roles", "path": "/roles/0/body/-"}]}',
    '{"patch": [{"op": "add", "path": "/hash", "value": "deadbeef"}]}',
    '{"patch": [{"op": "add", "path": "/genome", "value": {"ir": {}}}]}',
    '{"patch": [{"op": "replace", "path": "/arch", "value": "sm_99"}]}',
    '{"kernel": {"name": "k"}}', '{"kernel": [1]}', '{"roles": "many"}',
    '{"patch": [{"op": "test", "path": "/name", "value": "other"}]}',
    json.dumps({"patch": [{"op": "copy", "from": "/roles", "path": f"/roles/0/body/-"} for _ in range(40)]}),
    "[" * 5000 + "]" * 5000,                                      # deep nesting
    '{"patch": ' + "[" * 200 + "]" * 200 + "}",
    "x" * (5 * 2**20),                                            # 5 MB of text
    '{"patch": [], "pad": "' + "y" * (5 * 2**20) + '"}',          # 5 MB of valid JSON
    "```json\n" * 200_000,                                        # unclosed fences
    '{"patch": [{"op": "replace", "path": "/launch/threads", "value": 1e999}]}',
    '{"patch": [{"op": "replace", "path": "/launch/threads", "value": NaN}]}',
    '{"patch": [{"op": "replace", "path": "/launch/threads", "value": ' + "9" * 5000 + '}]}',
    "\ud800", "\x00{}\x00",
]

GOOD = [
    ('```json\n{"patch": [{"op": "replace", "path": "/launch/threads", "value": 128}]}\n```', "patch"),
    ('Here you go: {"patch": [{"op": "replace", "path": "/launch/threads", "value": 128}]} done', "patch"),
    ('[{"op": "replace", "path": "/launch/threads", "value": 128}]', "patch"),
    (json.dumps({"kernel": SEED}), "program"),
    (json.dumps(SEED), "program"),
]


@pytest.fixture
def trapped(tmp_path, monkeypatch):
    """cwd in tmp; anything that would run a command or evaluate text fails the test."""
    monkeypatch.chdir(tmp_path)
    calls = []

    def trap(name, original=None):
        def f(*a, **k):
            if original is not None and not any(t in str(a[:1]) for t in ("PWNED", "system(", "__import__")):
                return original(*a, **k)  # imports and dataclasses exec their own code
            calls.append((name, a))
            raise AssertionError(f"{name} called while handling a reply: {a!r:.200}")
        return f
    monkeypatch.setattr(os, "system", trap("os.system"))
    monkeypatch.setattr(os, "popen", trap("os.popen"))
    monkeypatch.setattr(subprocess, "Popen", trap("subprocess.Popen"))
    monkeypatch.setattr(builtins, "eval", trap("eval", builtins.eval))
    monkeypatch.setattr(builtins, "exec", trap("exec", builtins.exec))
    yield tmp_path / "PWNED", calls


def test_each_malformed_reply_is_rejected_with_a_reason(trapped):
    sentinel, calls = trapped
    for text in MALFORMED + _attacks(str(sentinel)):
        try:
            program, mode = parse_reply(text, SEED)
        except ReplyError as e:
            assert str(e).strip(), repr(text[:80] if text else text)
            assert len(str(e)) < 5000, "the reason quoted back in the repair turn stays short"
        else:
            # usable replies are data: a loaded program whose strings are not code
            assert mode in ("patch", "program")
    assert not sentinel.exists() and not calls


def test_free_text_in_a_note_is_only_data(trapped):
    sentinel, calls = trapped
    attack = _attacks(str(sentinel))[4]
    program, mode = parse_reply(attack, SEED)
    assert mode == "patch" and "os" in program["note"]
    from cake_ir.compiler import compile_kernel
    from cake_ir.io import load
    res = compile_kernel(load(program)[0], emit="cuda")
    assert res.ok and not sentinel.exists() and not calls


def test_usable_replies_parse():
    for text, mode in GOOD:
        program, got = parse_reply(text, SEED)
        assert got == mode and program["name"] == SEED["name"]


def test_enormous_and_deep_replies_are_refused_quickly():
    import time
    for text in ("x" * (5 * 2**20), "[" * 100_000 + "]" * 100_000, "```json\n" * 700_000):
        t0 = time.perf_counter()
        with pytest.raises(ReplyError):
            extract_json(text)
        assert time.perf_counter() - t0 < 2.0
    assert MAX_REPLY_CHARS < 5 * 2**20

# The same replies through the real campaign loop (litellm -> loopback HTTP): tests/test_api_key_leak.py.
