"""Warp-stall samples of an Nsight Compute source page (`ncu -i REP --page source --csv --print-source sass`)
summed by SASS opcode: which instruction kinds a kernel's time sits on (e.g. RED vs HGMMA vs the argmin).

    python bench/ncu_opcodes.py KERNEL-sass.csv[.gz] [--top 15]
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import sys

STALL = "Warp Stall Sampling (All Samples)"


def opcode(source: str) -> str:
    """The opcode of a SASS line with its predicate and operands dropped ('@P0 RED.E.ADD.F32...' -> 'RED')."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def samples_by_opcode(text: str) -> collections.Counter:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    counts = collections.Counter()
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        try:
            counts[opcode(row["Source"])] += int(row[STALL] or 0)
        except (KeyError, ValueError):
            continue
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    raw = open(a.csv, "rb").read()
    text = (gzip.decompress(raw) if a.csv.endswith(".gz") else raw).decode()
    counts = samples_by_opcode(text)
    total = sum(counts.values()) or 1
    for op, n in counts.most_common(a.top):
        print(f"{op:12s} {n:9d} {100 * n / total:5.1f}%")
    print(f"{'total':12s} {total:9d}", file=sys.stderr)


if __name__ == "__main__":
    main()
