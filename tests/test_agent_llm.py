"""The LLM proposer end to end against an OpenAI-compatible server on 127.0.0.1 started here (an
http.server in a thread that replays scripted replies and records every request): the prompt is
built (task, base IR, localized diagnostics, tactics, notes), replies are parsed (JSON Patch and full
programs), a malformed reply is repaired in one turn or recorded as a proposer failure, and the token
budget stops the run. The campaign is a real `agent.run` (litellm -> HTTP -> this server)."""
import json
import os
import sqlite3

import pytest

from agent.llm import ReplyError, extract_json
from llm_server import LoopbackLLM

TOKENS_PER_REPLY = 1000


class ScriptedLLM(LoopbackLLM):
    """Replays scripted replies and records every request (path and JSON body)."""

    tokens_per_reply = TOKENS_PER_REPLY


@pytest.fixture
def env(tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith("CAKE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CAKE_LIBRARY_DIR", str(tmp_path / "lib"))
    monkeypatch.setenv("CAKE_CACHE_DIR", str(tmp_path / "cubin"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-test")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_llm_campaign_prompt_parse_repair_reject_budget(env):
    from agent.run import main
    from tasks.registry import get

    seed = get("softmax").seed_genomes()[0]["ir"]
    malformed = 'Sure! Here it is: {"patch": [ {"op": "replace", "path": "/launch/threads",'
    expected_error = None
    try:
        extract_json(malformed)
    except ReplyError as e:
        expected_error = str(e)
    replies = [
        malformed,                                                       # 1: not JSON -> repair turn
        json.dumps({"patch": [{"op": "replace", "path": "/buffers/0/vec", "value": 1},    # 2: repaired: a patch
                              {"op": "replace", "path": "/buffers/1/vec", "value": 1}],   #    that fails verify
                    "why": "smaller chunks"}),
        json.dumps({"patch": [{"op": "replace", "path": "/roles/3/regs", "value": 64}]}),  # 3: bad path -> repair
        json.dumps({"kernel": {**seed, "arch": "sm_99"}}),                # 4: schema error -> proposer failure
        "```json\n" + json.dumps({"patch": [{"op": "replace", "path": "/launch/threads", "value": 128},
                                            {"op": "replace", "path": "/roles/0/warps", "value": [0, 4]}]}) + "\n```",
    ]                                                                    # 5: a good patch; budget then spent
    with ScriptedLLM(replies) as llm:
        rc = main(["--task", "softmax", "--dry-run", "--proposer", "llm", "--model", "openai/cake-test",
                   "--api-base", llm.url, "--token-budget", str(4 * TOKENS_PER_REPLY + 500), "--batch", "1",
                   "--max-candidates", "20", "--context-tokens", "6000", "--run-id", "llm1", "--plain"])
        reqs = llm.requests
    assert rc == 0
    assert len(reqs) == 5, [r["body"]["messages"][-1]["content"][:80] for r in reqs]
    assert all(r["path"].endswith("/chat/completions") and r["body"]["model"] == "cake-test" for r in reqs)

    # the first prompt: task, base IR, reply format, tactics; within the context budget
    first = reqs[0]["body"]["messages"]
    assert [m["role"] for m in first] == ["system", "user"]
    user = first[1]["content"]
    assert "## Task: softmax" in user and '"name":"softmax_row_n4096"' in user
    assert "## Reply format" in user and "## Tactics that may apply" in user
    assert (len(first[0]["content"]) + len(user)) / 4 <= 6000
    # the repair turn quotes the exact error after the model's own reply
    rep = reqs[1]["body"]["messages"]
    assert [m["role"] for m in rep] == ["system", "user", "assistant", "user"]
    assert rep[2]["content"] == malformed and expected_error in rep[3]["content"]
    # the next prompt carries the localized diagnostics of the failed candidate and the notes
    third = reqs[2]["body"]["messages"][1]["content"]
    assert "E-CPY-04" in third and "/roles/0/body/0/vec_bytes" in third and "IR around the node" in third
    assert "## Experience notes" in third and "failed verify E-CPY-04" in third
    assert "op 0 (replace /roles/3/regs): index 3 out of range at /roles" in reqs[3]["body"]["messages"][3]["content"]
    # the proposer failure is in the next prompt too; max_tokens is capped by what the budget leaves
    assert "E-PROPOSER-REPLY" in reqs[4]["body"]["messages"][1]["content"]
    assert reqs[4]["body"]["max_tokens"] <= 500

    con = sqlite3.connect(env / "home" / "cake.db")
    rows = con.execute("select strategy, tactic, status, stage from candidates where run_id='llm1' order by id").fetchall()
    assert rows[0][:1] == ("seed",)
    llm_rows = [r for r in rows if r[0] == "llm"]
    assert [(r[2], r[3]) for r in llm_rows] == [("failed", "verify"), ("ok", "compile")]
    assert {r[1] for r in llm_rows} == {"llm_patch"}
    fails = con.execute("select stage, code, message, candidate_id from failures where run_id='llm1'").fetchall()
    prop = [f for f in fails if f[0] == "propose"]
    assert len(prop) == 1 and prop[0][1] == "E-PROPOSER-REPLY" and "schema" in prop[0][2] and prop[0][3] is None
    assert any(f[1] == "E-CPY-04" and f[0] == "verify" for f in fails)
    run = con.execute("select status, stop_reason, summary from runs where id='llm1'").fetchone()
    assert run[0] == "finished" and "token budget exhausted (5000 of 4500 tokens)" in run[1]
    llm_stats = json.loads(run[2])["strategies"]["llm"]
    assert llm_stats["tokens"] == 5 * TOKENS_PER_REPLY and llm_stats["calls"] == 5


def test_llm_call_failures_stop_the_strategy(env):
    """A server that is not there: each call is a recorded proposer failure; three in a row stop it."""
    import socket

    from agent.run import main
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now
    rc = main(["--task", "softmax", "--dry-run", "--proposer", "llm", "--model", "openai/cake-test",
               "--api-base", f"http://127.0.0.1:{port}/v1", "--batch", "1", "--max-candidates", "10",
               "--run-id", "llm2", "--quiet"])
    assert rc == 0
    con = sqlite3.connect(env / "home" / "cake.db")
    codes = [r[0] for r in con.execute("select code from failures where run_id='llm2' and stage='propose'")]
    assert codes == ["E-PROPOSER-CALL"] * 3
    stop = con.execute("select stop_reason from runs where id='llm2'").fetchone()[0]
    assert "3 failed calls in a row" in stop


class RefusingLLM(LoopbackLLM):
    """Answers every call with 401, as a provider does for a wrong key."""

    def answer(self, handler, body):
        return 401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                               "code": "invalid_api_key"}}


def test_llm_without_credentials_says_so_and_exits_nonzero(env, monkeypatch, capsys):
    """No key in the environment and no server URL: plainly said before anything runs; exit 2 when the
    llm is the only proposer, and the run goes on without it when another one is there."""
    from agent.run import main
    monkeypatch.delenv("OPENAI_API_KEY")
    rc = main(["--task", "softmax", "--dry-run", "--proposer", "llm", "--model", "openai/gpt-4o-mini",
               "--max-candidates", "2", "--run-id", "nokey1", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "no credentials for openai/gpt-4o-mini: set OPENAI_API_KEY" in err
    assert not (env / "home" / "cake.db").exists() or not sqlite3.connect(env / "home" / "cake.db").execute(
        "select count(*) from runs where id='nokey1'").fetchone()[0]
    rc = main(["--task", "softmax", "--dry-run", "--proposer", "search,llm", "--model", "openai/gpt-4o-mini",
               "--max-candidates", "3", "--run-id", "nokey2", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0 and "warning: no credentials" in err and "running without the llm proposer (bandit+evolve)" in err


def test_llm_refused_credentials_stop_at_once_and_exit_nonzero(env, capsys):
    """A provider that refuses the key (401): one recorded proposer failure, the strategy stops at once
    with the cause, and agent.run exits 1 when the llm was the only proposer."""
    from agent.run import main
    with RefusingLLM([]) as llm:
        rc = main(["--task", "softmax", "--dry-run", "--proposer", "llm", "--model", "openai/cake-test",
                   "--api-base", llm.url, "--llm-timeout", "20", "--batch", "2", "--max-candidates", "10",
                   "--run-id", "refused1", "--quiet"])
        assert len(llm.requests) == 1
    err = capsys.readouterr().err
    assert rc == 1 and "refused the credentials for openai/cake-test" in err
    con = sqlite3.connect(env / "home" / "cake.db")
    codes = [r[0] for r in con.execute("select code from failures where run_id='refused1' and stage='propose'")]
    assert codes == ["E-PROPOSER-CALL"]
