"""The tactic library: retrieval by meaning (tactics.base.rank / retrieve) and the CLI
(python -m agent.tactics query / show)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUERY = "avoid shared memory bank conflicts"


def _words(text: str) -> set:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def test_swizzle_found_by_meaning_alone():
    from tactics.base import get_tactic, index_text, chunks, retrieve
    sw = get_tactic("swizzle")
    indexed = " ".join([index_text(sw), *chunks(sw), sw.name, *sw.keywords, sw.params_doc])
    assert not (_words(QUERY) & _words(indexed)), "the swizzle text must share no word with the query"
    assert retrieve(QUERY, k=1)[0].name == "swizzle"


def test_other_meaning_queries():
    from tactics.base import rank, retrieve
    assert retrieve("hide TMA latency", k=1)[0].name in ("stages", "wgmma_overlap")
    assert retrieve("overlap copies with compute", k=1)[0].name == "stages"
    assert retrieve("tensor cores sit idle between k-steps", k=1)[0].name == "wgmma_overlap"
    assert retrieve("loop overhead", k=1)[0].name == "unroll"
    assert retrieve("misaligned vector access E-CPY-04", k=1)[0].name == "vector_width"
    scores = [s for _, s in rank("hide TMA latency")]
    assert scores == sorted(scores, reverse=True)


def test_arch_filter():
    from tactics.base import retrieve
    names = [t.name for t in retrieve("rebalance setmaxnreg registers of producer and consumer", k=20, arch="sm_80")]
    assert "register_split" not in names and "wgmma_overlap" not in names and "stages" in names
    assert retrieve("rebalance setmaxnreg registers of producer and consumer", k=1, arch="sm_90a")[0].name == "register_split"


def _env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAKE_")}
    env.update(CAKE_HOME=str(tmp / "home"), PYTHONPATH=str(ROOT))
    return env


def test_cli_show_is_quick_and_light(tmp_path):
    code = ("import sys, time; t = time.perf_counter(); from agent.tactics import main; rc = main(['show', 'stages']); "
            "print('HEAVY', 'chromadb' in sys.modules, 'tokenizers' in sys.modules, round(time.perf_counter() - t, 2))")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "Change the pipeline depth" in out and "S: 2..8" in out and "tactics/stages.py" in out
    assert "no const S" in out                       # preconditions
    assert "statistics:    none yet" in out
    assert "HEAVY False False" in out                 # no chromadb / embedding for `show`


def test_cli_query_ranks_and_shows_statistics(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CAKE_DB_URL", raising=False)
    from knowledge.models import TacticStatRow
    from knowledge.store import Store
    store = Store()
    with store.session() as s:
        s.add(TacticStatRow(tactic="swizzle", task="gemm", arch="sm_90a", applied=10, ok=8, improved=4,
                            gains=[0.02, 0.05, -0.01, 0.03]))
        s.add(TacticStatRow(tactic="swizzle", task="softmax", arch="sm_90a", applied=3, ok=0, improved=0, gains=[]))
        s.commit()
    from agent.tactics import main
    assert main(["query", QUERY, "--task", "gemm", "--arch", "sm_90a", "-k", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in rows] == [1, 2, 3] and rows[0]["name"] == "swizzle"
    assert rows[0]["applied"] == 10 and rows[0]["success_rate"] == 0.8 and abs(rows[0]["median_gain"] - 0.025) < 1e-9
    assert main(["query", QUERY, "-k", "2"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"1\s+swizzle\s+0\.\d\d\s+13\s+62%\s+\+2\.5%", text), text     # all tasks: 8/13 ok
    assert main(["query", "rebalance setmaxnreg registers", "--arch", "sm_80", "--json", "-k", "20"]) == 0
    assert "register_split" not in {r["name"] for r in json.loads(capsys.readouterr().out)}
    assert main(["show", "nope"]) == 2
