"""API keys never reach the DB, logs, reports, checkpoints or the library export.

One real LLM campaign (litellm -> HTTP -> a loopback OpenAI-compatible server on 127.0.0.1) runs with
sentinel keys in the environment. The server first replays hostile replies (code to execute, a Python
block, a wrong-schema program, an oversized reply: each becomes a repair turn or a recorded
E-PROPOSER-REPLY and nothing runs), then answers 401 with the caller's Authorization header echoed in
the error body, as some proxies do, so the key appears in the exception text litellm raises. Every file
under the run's directory (the .cake home with cake.db, checkpoints, reports, the library export,
cubin cache, logs) is then searched for the sentinel bytes.
"""
import os
import sqlite3
from pathlib import Path

from llm_server import LoopbackLLM
from test_malformed_replies import _attacks

from agent.llm import MAX_REPLY_CHARS

KEY = "sk-SENTINEL-7f3a9c1e5b2d4f60"
CAKE_KEY = "cake-SENTINEL-key-0a1b2c3d4e"


class EchoingLLM(LoopbackLLM):
    """Replays `replies`, then answers 401 quoting the request's Authorization header."""

    tokens_per_reply = 1000

    def record(self, handler, body) -> dict:
        return {k.lower(): v for k, v in handler.headers.items()}

    def exhausted(self, handler, body):
        return 401, {"error": {"message": f"Incorrect API key: {handler.headers.get('Authorization')}",
                               "type": "invalid_request_error", "code": "invalid_api_key"}}


def test_keys_never_written_and_hostile_replies_never_run(tmp_path, monkeypatch, capsys):
    from agent.run import main
    for k in list(os.environ):
        if k.startswith("CAKE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / ".cake"))
    monkeypatch.setenv("CAKE_LIBRARY_DIR", str(tmp_path / "lib"))
    monkeypatch.setenv("CAKE_CACHE_DIR", str(tmp_path / "cubin"))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    monkeypatch.chdir(tmp_path)
    sentinel = tmp_path / "PWNED"
    a = _attacks(str(sentinel))
    replies = [a[0], a[2], a[1], a[5], "x" * (MAX_REPLY_CHARS + 1), a[6]]
    with EchoingLLM(replies) as llm:
        rc = main(["--task", "softmax", "--dry-run", "--proposer", "llm", "--model", "openai/cake-test",
                   "--api-base", llm.url, "--batch", "1", "--max-candidates", "12", "--run-id", "keyleak",
                   "--plain"])
        reqs = llm.requests
    out = capsys.readouterr()
    assert rc == 1 and len(reqs) == 6 + 1        # a refused key stops the only proposer at once: exit 1
    assert any(KEY in h.get("authorization", "") for h in reqs), "the key did reach the provider"
    assert not sentinel.exists()

    con = sqlite3.connect(tmp_path / ".cake" / "cake.db")
    fails = con.execute("select code, message from failures where run_id='keyleak' and stage='propose'").fetchall()
    codes = [f[0] for f in fails]
    assert codes.count("E-PROPOSER-REPLY") == 3 and codes.count("E-PROPOSER-CALL") == 1, codes
    assert all(f[1] for f in fails)
    con.close()

    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "PWNED"]
    assert any(p.suffix == ".db" for p in written) and any(p.suffix == ".html" for p in written)
    leaks = [str(p.relative_to(tmp_path)) for p in written if KEY.encode() in p.read_bytes()]
    assert not leaks, f"API key written to {leaks}"
    assert KEY not in out.out and KEY not in out.err
    assert "refused the credentials for openai/cake-test" in out.err


def test_cake_llm_api_key_is_redacted_too(monkeypatch):
    from agent.llm import redact
    monkeypatch.setenv("CAKE_LLM_API_KEY", CAKE_KEY)
    text = redact(f"AuthenticationError: bad key {CAKE_KEY}; header Bearer {CAKE_KEY}; other sk-abcdefgh12345")
    assert CAKE_KEY not in text and "sk-abcdefgh12345" not in text and "CAKE_LLM_API_KEY" in text
