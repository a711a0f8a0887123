#!/bin/bash
# `python -m agent.run --task kda` on one GPU as a user runs it, measured: how soon the first candidate
# is timed and how many are timed per minute.
#   bash bench/agent_kda_device.sh RUNS...      each RUN is NAME:MINUTES[:EXTRA AGENT.RUN ARGS], e.g.
#   bash bench/agent_kda_device.sh cold:4 "warm:2.5:--proposer search,explore"
# All runs share one CAKE_HOME ($AGENT_HOME, default /tmp/cake-agent, emptied first unless AGENT_KEEP=1),
# so the first is cold (no cubins, task data or baselines cached) and later ones find the caches.
# Needs the agent's wheels in .whl (python scripts/device_wheels.py --agent --baselines), named in carry.
# Writes to $OUT: one log per run, agent-kda-rate.json (bench/agent_rate.py) and agent-kda.tgz (logs,
# reports, the knowledge DB). AGENT_GPU_TESTS=EXPR first runs the GPU tests of tests/test_gpu_eval.py that
# pytest -k EXPR selects.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD
H=${AGENT_HOME:-/tmp/cake-agent}
[ "${AGENT_KEEP:-0}" = 1 ] || rm -rf "$H"
mkdir -p "$H" $OUT/logs
export CAKE_HOME=$H CAKE_CACHE_DIR=$H/cubin CAKE_LIBRARY_DIR=$H/library
nvidia-smi -L
if [ -n "${AGENT_GPU_TESTS:-}" ]; then
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_eval.py -k "$AGENT_GPU_TESTS" \
    > $OUT/logs/gpu-tests.log 2>&1
  echo "gpu tests: $(tail -1 $OUT/logs/gpu-tests.log)"
fi
specs=()
for spec in "$@"; do
  name=${spec%%:*}; rest=${spec#*:}; minutes=${rest%%:*}; extra=""
  [ "$rest" != "$minutes" ] && extra=${rest#*:}
  start=$(date +%s.%N)
  # shellcheck disable=SC2086 - extra holds several arguments
  timeout $(python3 -c "print(int($minutes * 60 * 1.3 + 60))") python3 -m agent.run --task kda --gpus 0 \
    --budget-minutes $minutes --max-candidates 5000 --plain --no-vectors --run-id kda-$name $extra \
    > $OUT/logs/$name.log 2>&1
  echo "run $name: exit $? after $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
  specs+=(--run "kda-$name:$start")
done
python3 bench/agent_rate.py --home $H "${specs[@]}" --out $OUT/agent-kda-rate.json \
  --command "bash bench/agent_kda_device.sh $*"
cp -r $H/reports $OUT/logs/ 2>/dev/null
cp $H/cake.db $OUT/logs/ 2>/dev/null
tar czf $OUT/agent-kda.tgz -C $OUT logs
for spec in "$@"; do name=${spec%%:*}; echo "--- $name"; sed -n '/^== run /,$p' $OUT/logs/$name.log | head -30; done
