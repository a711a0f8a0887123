#!/bin/bash
# A long `python -m agent.run --task kda` on one GPU, across two device calls (one call may run 10 minutes):
#   bash bench/agent_long_device.sh start MINUTES [AGENT.RUN ARGS]   installs the wheels (.whl, carried), runs
#        the GPU tests that AGENT_GPU_TESTS selects (pytest -k), starts the run detached (setsid) from the seeds
#        on a cold CAKE_HOME, and returns after AGENT_WAIT_S seconds (default 540) with the log's tail
#   bash bench/agent_long_device.sh collect     (the next call, while the machine is still held) waits for the
#        run to end, then writes agent-kda-long.json (bench/agent_rate.py) and agent-kda-long.tgz (log, report,
#        knowledge DB, library entry) to $OUT
# The run's library is $H/library, seeded with a copy of tasks/kda/library, so the export compares the run's
# best with the library's current pick timed in the same run.
set -u
export PYTHONUNBUFFERED=1
H=/tmp/cake-long
export PYTHONPATH=/tmp/site:$PWD CAKE_HOME=$H CAKE_CACHE_DIR=$H/cubin CAKE_LIBRARY_DIR=$H/library
case "$1" in
start)
  t0=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
  rm -rf $H && mkdir -p $H/library/kda && cp -r tasks/kda/library $H/library/kda/
  if [ -n "${AGENT_GPU_TESTS:-}" ]; then
    timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_eval.py -k "$AGENT_GPU_TESTS" \
      > $H/gpu-tests.log 2>&1
    echo "gpu tests: $(tail -1 $H/gpu-tests.log)"; grep -E "^E " $H/gpu-tests.log | head -5
  fi
  minutes=$2; shift 2
  date +%s.%N > $H/start
  setsid bash -c "python3 -m agent.run --task kda --gpus 0 --budget-minutes $minutes --max-candidates 5000 \
      --plain --no-vectors --run-id kda-long $* > $H/run.log 2>&1; echo \$? > $H/exit" < /dev/null &
  while [ $(( $(date +%s) - t0 )) -lt ${AGENT_WAIT_S:-540} ] && [ ! -f $H/exit ]; do sleep 5; done
  grep -E "^\[kda-long\] (it|baseline|library|workers)" $H/run.log | tail -6 | cut -c1-220
  ;;
collect)
  while [ ! -f $H/exit ]; do sleep 2; done
  echo "run exit $(cat $H/exit), $(python3 -c "import time; print(round(time.time() - $(cat $H/start), 1))") s after its start"
  python3 bench/agent_rate.py --home $H --run "kda-long:$(cat $H/start)" --out $OUT/agent-kda-long.json \
    --command "bash bench/agent_long_device.sh start ${AGENT_MINUTES:-10}; bash bench/agent_long_device.sh collect"
  cp $H/reports/kda-long.html $H/ 2>/dev/null
  tar czf $OUT/agent-kda-long.tgz -C $H run.log cake.db kda-long.html library gpu-tests.log 2>/dev/null
  sed -n '/^== run /,$p' $H/run.log
  ;;
esac
