#!/bin/bash
# Host overhead per small call, A/B of two trees in one machine run: correctness of the working tree's forms
# first, then bench/knn_host_overhead.py `time` for PREV (a tree holding the earlier cakelib, default .prev)
# and for this tree, alternated twice (HOST_ROUNDS) so drift in the VM's CPU shows, each cut at HOST_DEADLINE_S
# (default 80). Results: $OUT/host-{prev,new}-{1,2}.json.
#   PREV=.prev OUT=DIR [HOST_ROUNDS=2] [HOST_DEADLINE_S=80] bash bench/host_overhead_ab_device.sh
. "$(dirname "$0")/device_env.sh"
PREV=${PREV:-.prev}
timeout 60 $PY bench/knn_host_overhead.py check --out $OUT/host-check.json > $OUT/host-check.log 2>&1
stamp "check rc=$?"
grep -E "^check|Error" $OUT/host-check.log | cut -c1-300 | head -12
HD=${HOST_DEADLINE_S:-80}
for round in $(seq 1 ${HOST_ROUNDS:-2}); do
  for tree in prev new; do
    dir=.; [ $tree = prev ] && dir=$PREV
    (cd $dir && timeout $(( HD + 20 )) $PY bench/knn_host_overhead.py time --check $OUT/host-check.json \
      --out $OUT/host-$tree-$round.json --calls 100 --deadline-s $HD > $OUT/host-$tree-$round.log 2>&1)
    stamp "$tree round $round rc=$?"
  done
done
tail -34 $OUT/host-new-${HOST_ROUNDS:-2}.log
$PY - "$OUT" <<'PYEOF'
import json, sys, glob
runs = {f.split("/")[-1][5:-5]: json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/host-*-[12].json"))}
print("host us per call (median of 7 loops of 100):", "  ".join(runs))
rows = {}
for name, r in runs.items():
    for row in r["rows"]:
        label = row["op"] + " " + ",".join(str(v) for v in row["shape"].values())
        for impl, t in row["impls"].items():
            rows.setdefault((label, impl), {})[name] = t.get("host_us")
for (label, impl), v in rows.items():
    print(f"{label:28s} {impl:13s}", "  ".join(f"{v.get(n, float('nan')) or float('nan'):8.2f}" for n in runs))
PYEOF
