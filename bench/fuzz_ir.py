"""Fuzz the IR front end at volume: mutated seed programs through load -> verify -> print -> cost -> lower.

    python bench/fuzz_ir.py --n 20000 --seed 0

Prints counts: loaded, rejected at load, verified clean, with diagnostics, and crashes grouped by
stage and location (an unhandled exception anywhere is a crash; diagnostics are not). Exit 1 on any
crash. The mutation core is tests/_fuzz.py (shared with tests/test_fuzz_ir.py, which runs a CI-sized
slice of the same thing under hypothesis).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import resource
import signal
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

import _fuzz  # noqa: E402


def documents(n: int, rng: random.Random):
    seeds = _fuzz.seed_documents()
    for i in range(n):
        _, doc = seeds[i % len(seeds)]
        r = rng.random()
        if r < 0.75:
            yield _fuzz.mutate(doc, rng)
        elif r < 0.88:
            yield _fuzz.cross_reference(doc, rng)
        elif r < 0.95:  # truncated JSON text
            text = json.dumps(_fuzz.mutate(doc, rng, n=0))
            yield text[: rng.randrange(len(text))] if rng.random() < 0.7 else text
        else:
            yield _fuzz.deep_nesting(rng.choice([1, 8, 30, 63, 64, 65, 200]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=1, help="example documents to print per crash location")
    ap.add_argument("--dump", help="write one example document per crash location into this folder")
    ap.add_argument("--doc-seconds", type=float, default=5.0, help="per-document limit (a hang is a crash)")
    ap.add_argument("--mem-gb", type=float, default=4.0, help="address-space limit (a blow-up is a crash)")
    a = ap.parse_args(argv)
    lim = int(a.mem_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    def on_alarm(*_):
        raise TimeoutError(f"document took longer than {a.doc_seconds}s")
    signal.signal(signal.SIGALRM, on_alarm)
    rng = random.Random(a.seed)
    counts = collections.Counter()
    crashes = collections.Counter()
    examples: dict[str, list] = collections.defaultdict(list)
    t0 = time.perf_counter()
    for doc in documents(a.n, rng):
        signal.setitimer(signal.ITIMER_REAL, a.doc_seconds)
        outcome, where = _fuzz.check(doc)
        signal.setitimer(signal.ITIMER_REAL, 0)
        counts[outcome] += 1
        if where:
            crashes[where] += 1
            if len(examples[where]) < a.show:
                examples[where].append(doc)
    dt = time.perf_counter() - t0
    loaded = counts["clean"] + counts["diagnostics"] + counts["crash"]
    print(f"documents {a.n} in {dt:.1f}s: loaded {loaded}, rejected at load {counts['rejected']}, "
          f"verified clean {counts['clean']}, diagnostics {counts['diagnostics']}, crashes {counts['crash']}")
    for where, c in crashes.most_common():
        print(f"  crash x{c}: {where}")
        for j, ex in enumerate(examples[where]):
            text = ex if isinstance(ex, str) else json.dumps(ex)
            print("    example:", text[:300], "...")
            if a.dump:
                os.makedirs(a.dump, exist_ok=True)
                name = "".join(ch if ch.isalnum() else "_" for ch in where)[:120]
                with open(os.path.join(a.dump, f"{name}_{j}.json"), "w") as f:
                    f.write(text)
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
