#!/bin/bash
# Nsight Compute: each kernel's GPU time in one library kNN call (the norms, sample, search and merge
# kernels of a Program), at the shapes where the grid loses -> $OUT/ncu-parts/*.csv and a table.
#     OUT=/some/dir bash bench/ncu_knn_parts.sh ["Q M k" ...]      (on the GPU machine)
mkdir -p $OUT/ncu-parts
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=("1 100000 16" "1 100000 10" "16 262144 16" "32 100000 16" "64 4194304 16" \
  "64 4194304 10" "128 262144 16" "1024 100000 16" "32768 32768 16")
for s in "${shapes[@]}"; do
  f=$OUT/ncu-parts/$(echo $s | tr ' ' _).csv
  timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    python3 bench/profile_lib.py knn $s > $f 2>/dev/null
  echo "== Q M k = $s (rc=$?): the last call's kernels, us"
  python3 - "$f" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
ki, vi, ii = head.index("Kernel Name"), head.index("Metric Value"), head.index("ID")
ks = [(int(r[ii]), r[ki], float(r[vi].replace(",", "")) / 1e3) for r in rows]   # (ncu groups digits)
n = len(ks) // 2    # profile_lib makes the call twice: the second half is the last call
print("   ", "  ".join(f"{name[:44]} {us:.1f}" for _, name, us in ks[n:]), f"| sum {sum(u for *_, u in ks[n:]):.1f}")
PY
done
