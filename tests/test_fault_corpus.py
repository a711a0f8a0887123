"""The fault corpus (tests/fault_corpus/cases.json): kernels that crash, hang, cheat or compute the
wrong thing, each evaluated through the worker pool and caught with its expected status and
error_class, the pool serving a correct candidate after every one.

CPU part: the corpus files are current and every case compiles (NVRTC). GPU part (marked gpu): the
evaluations themselves.
"""
import json
import pathlib
import re
import subprocess
import sys

import pytest

from gpu_backend.candidate import CudaCandidate, compile_candidate
from gpu_backend.driver import gpu_available
from gpu_backend.record import ERROR_CLASSES

CORPUS = pathlib.Path(__file__).resolve().parent / "fault_corpus"
ROOT = CORPUS.parent.parent
CASES = json.loads((CORPUS / "cases.json").read_text())["cases"]


def _inline(path: pathlib.Path) -> str:
    """Inline `#include "local.cuh"` (NVRTC gets one self-contained source)."""
    def sub(m):
        return _inline(path.parent / m.group(1))
    return re.sub(r'^#include "([^"]+)"\s*$', sub, path.read_text(), flags=re.M)


def case_job(case: dict) -> dict:
    path = (CORPUS / case["file"]).resolve()
    if path.suffix == ".cu":
        cand = CudaCandidate(name=path.stem, source=_inline(path), kernel_name=case["kernel_name"],
                             grid=case["grid"], threads=case["threads"], signature=case["signature"],
                             smem_bytes=case.get("smem_bytes", 0)).model_dump()
    else:
        cand = path.read_text()
    job = {"candidate": cand, "task": case["task"], "verify": case.get("verify", True), "name": path.stem,
           "profile": False, "deadline_s": case.get("deadline_s", 120)}
    if "seed" in case:
        job["seed"] = case["seed"]
    return job


def good_job() -> dict:
    text = (ROOT / "tasks" / "softmax" / "seeds" / "softmax_row_n4096.json").read_text()
    return {"candidate": text, "task": "softmax", "name": "softmax_seed", "profile": False, "deadline_s": 120}


def _expected(case, key):
    v = case[key]
    return v if isinstance(v, list) else [v]


# ----------------------------------------------------------------------------- CPU
def test_corpus_files_current():
    r = subprocess.run([sys.executable, str(CORPUS / "make_corpus.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("case", CASES, ids=[c["file"].rsplit("/", 1)[-1] for c in CASES])
def test_corpus_case_compiles(case):
    for cls in _expected(case, "error_class"):
        assert cls in ERROR_CLASSES, cls
    job = case_job(case)
    c = compile_candidate(job["candidate"], "sm_90a", verify=job["verify"])
    assert c.ok, c.diagnostics[:3]


# ----------------------------------------------------------------------------- GPU
@pytest.fixture(scope="module")
def corpus_records():
    from gpu_backend.worker import WorkerPool
    jobs = []
    for case in CASES:
        jobs += [case_job(case), good_job()]
    with WorkerPool(gpus=[0]) as pool:
        recs = pool.run(jobs)
        stats = dict(pool.stats)
    out = {}
    for i, case in enumerate(CASES):
        out[case["file"]] = (recs[2 * i], recs[2 * i + 1])
    (ROOT / ".cake").mkdir(exist_ok=True)
    (ROOT / ".cake" / "fault_corpus_records.json").write_text(json.dumps(
        {"stats": stats, "records": [r.model_dump() for r in recs]}, indent=1, default=str))
    return out


@pytest.mark.parametrize("case", CASES, ids=[c["file"].rsplit("/", 1)[-1] for c in CASES])
@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")
def test_fault_caught_and_next_candidate_served(case, corpus_records):
    rec, after = corpus_records[case["file"]]
    assert rec.status in _expected(case, "status"), rec.short()
    assert rec.error_class in _expected(case, "error_class"), rec.short()
    if "node" in case:
        assert rec.node and rec.node.startswith(case["node"]), rec.short()
    assert rec.seed is not None and rec.task == case["task"]
    assert after.status == "ok", f"the candidate after {case['file']} was not served: {after.short()}"
    if rec.status in ("crash", "timeout"):
        assert after.worker_pid != rec.worker_pid    # a fresh worker
