#!/usr/bin/env bash
# Runs the GPU verification steps on a lent GPU machine (no network; wheels from
# ../shared/device/wheelhouse.sh carried in .whl). Every step is bounded; logs and products go to
# /tmp/gpuv/<step>/ and are packed into $OUT/gpuv-<steps>.tgz so that nothing is lost to a failure.
#   bash scripts/gpu_verify.sh env trace watch oracle      |   bash scripts/gpu_verify.sh fidelity sdpa chain pytest
#   bash scripts/gpu_verify.sh recorder steptime fixes bisect   |   bash scripts/gpu_verify.sh chain stoprule childcost
#   SEEDS_K=lazy_loading bash scripts/gpu_verify.sh seeds   (one scenario of tests/test_seeds_gpu.py per call: a chain each;
#   SEEDS_ARGS='-n 6' runs them side by side)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -d .whl ] && ! python3 -c 'import papermill' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD/lib PATH=/tmp/site/bin:$PATH JUPYTER_PATH=/tmp/site/share/jupyter PYTHONUNBUFFERED=1
RES=/tmp/gpuv; mkdir -p $RES
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,power.draw --format=csv > $RES/nvidia-smi.csv 2>&1
python3 -c 'import torch,sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name())' > $RES/versions.txt 2>&1
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2; mkdir -p $RES/$name
  local t0=$(date +%s)
  timeout -k 10 $limit "$@" > $RES/$name/log.txt 2>&1; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a $RES/steps.txt
  tail -25 $RES/$name/log.txt | sed "s/^/  [$name] /"
}
for s in "$@"; do case $s in
  env)      step env 150 python3 benchmarks/gpu_env.py --out $RES/env ;;
  trace)    step trace 280 python3 benchmarks/bench_trace_overhead.py --out $RES/trace --repeats 3 --variants ${TRACE_VARIANTS:-none,passthrough,ops,ops_python,auto,auto_python} ;;
  steptime) step steptime ${STEPTIME_LIMIT:-260} python3 benchmarks/bench_step_time.py --out $RES/steptime --repeats ${STEPTIME_REPEATS:-3} \
              --variants ${STEPTIME_VARIANTS:-none,ops,auto} --size ${STEPTIME_SIZE:-auto} ;;
  recorder) step recorder 170 python3 benchmarks/gpu_recorder_check.py --out $RES/recorder --skip benchmarks ;;
  fixes)    step fixes ${FIXES_LIMIT:-360} python3 benchmarks/bench_fixes.py --out $RES/fixes ${FIXES_ARGS:-} ;;
  watchcli) step watchcli 70 python3 -m gpulab watch --stall 5 --out $RES/watchcli/out --json $RES/watchcli/verdict.json \
              --fault spin:aten.mm@3 -- python3 tests/fixtures/spin_then_sync.py ;;
  drill03)  step drill03 170 python3 -m gpulab run --only 03 --out $RES/drill03/outputs -p device=cuda \
              -p fault=spin:aten.mm@3 -p stall_s=5 -p repeats=1 -p 'shrink=[]' ;;
  heldback03) step heldback03 170 python3 -m gpulab run --only 03 --out $RES/heldback03/outputs -p device=cuda \
              -p "workload=script:$PWD/tests/fixtures/gpu_threshold_spin.py --n 80" -p stall_s=5 -p repeats=1 ;;
  watch)    step watch 300 python3 benchmarks/gpu_watch.py --out $RES/watch ;;
  ttv)      step ttv 150 python3 benchmarks/bench_time_to_verdict.py --out $RES/ttv --stalls 2 --repeats 2 --tools py-spy ;;
  oracle)   step oracle 200 python3 benchmarks/bench_oracle.py --out $RES/oracle ;;
  stoprule) step stoprule 120 python3 benchmarks/bench_stop_rule.py --out $RES/stoprule ;;
  childcost) step childcost 200 python3 benchmarks/bench_child_cost.py --out $RES/childcost --repeats 2 ;;
  fidelity) step fidelity 220 python3 benchmarks/bench_fidelity.py --out $RES/fidelity ;;
  sdpa)     step sdpa 150 python3 benchmarks/bench_sdpa_table.py --out $RES/sdpa ;;
  chain)    step chain 540 python3 -m gpulab run --out $RES/chain/outputs --notebook-timeout 300 ;;
  smoke)    step smoke 300 python3 -m gpulab run --params params/smoke.yaml --out $RES/smoke/outputs ;;
  ttr)      step ttr ${TTR_LIMIT:-560} python3 benchmarks/bench_time_to_recommendation.py --out $RES/ttr --programs gpu \
              --stall ${TTR_STALL:-8} --limit 270 ${TTR_ARGS:-} ;;
  pytest)   step pytest ${PYTEST_LIMIT:-240} python3 -m pytest -q -m gpu -p no:cacheprovider ${PYTEST_ARGS:-} ;;
  wildstore) for i in $(seq ${WILD_N:-3}); do   # the flaky memcheck case, its verdict and stderr kept each time
              step wildstore$i 150 python3 -m pytest -q -m gpu -p no:cacheprovider --basetemp=$RES/wildstore$i/t \
                tests/test_memcheck.py -k wild; cp $RES/wildstore$i/t/*/w/verdict.json $RES/wildstore$i/ 2>/dev/null
              cp $RES/wildstore$i/t/*/w/stderr.txt $RES/wildstore$i/stderr.log 2>/dev/null; done ;;
  recorderdisk) step recorderdisk 120 python3 -m pytest -q -p no:cacheprovider tests/test_recorder_modes.py \
              -k "reserved or full_disk or says_full or prefault" ;;
  native)   step native 120 python3 -c 'from gpulab.trace import native; print(native.ensure_all() or "observer and hot path built")' ;;
  realstep) step realstep ${REALSTEP_LIMIT:-480} python3 benchmarks/bench_real_step.py --out $RES/realstep \
              --rounds ${REALSTEP_ROUNDS:-2} --steps ${REALSTEP_STEPS:-20} --modes ${REALSTEP_MODES:-eager,compiled} \
              --variants ${REALSTEP_VARIANTS:-none,watch,watch_nokernels,watch_dispatch} ;;
  diag)     step diag ${DIAG_LIMIT:-240} python3 scripts/diag_observer_cost.py --steps ${DIAG_STEPS:-20} \
              --modes ${DIAG_MODES:-eager,compiled} ${DIAG_ARGS:-} ;;
  jobverdict) step jobverdict ${JOBV_LIMIT:-300} python3 benchmarks/bench_job_verdict.py --out $RES/jobverdict \
              --cases ${JOBV_CASES:-gpu,train} --stall 5 ;;
  longwatch) step longwatch 200 python3 -m gpulab watch --stall 8 --on-stall keep --out $RES/longwatch/out \
              --json $RES/longwatch/verdict.json --timeout 60 -- python3 -m gpulab.workloads --device cuda --rung steps --steps 3000 ;;
  compiledhang) step compiledhang 200 python3 -m gpulab watch --stall 10 --out $RES/compiledhang/out \
              --json $RES/compiledhang/verdict.json -- python3 tests/fixtures/gpu_compiled_spin.py ;;
  eagerhang) step eagerhang 120 python3 -m gpulab watch --stall 8 --out $RES/eagerhang/out \
              --json $RES/eagerhang/verdict.json -- python3 tests/fixtures/gpu_threshold_spin.py --n 80 ;;
  fromgpu)  step fromgpu ${FROM_LIMIT:-300} python3 -m gpulab run --from $RES/eagerhang/out --out $RES/fromgpu/outputs \
              --notebook-timeout 240 ;;   # after eagerhang: the chain on what that watch caught
  bisect)   step bisect 420 python3 benchmarks/bench_bisect.py --out $RES/bisect --parts gpu ;;
  fp)       step fp 200 python3 benchmarks/bench_fingerprint.py --out $RES/fp --device cuda --steps 10 --warmup 3 ;;
  compare)  step compare 300 python3 -m gpulab compare --json $RES/compare/compare.json \
              "python3 tests/fixtures/numerics/layers_train.py --device cpu" "python3 tests/fixtures/numerics/layers_train.py --device cuda" ;;
  numerics) step numerics 400 python3 -m pytest -q -p no:cacheprovider -rs tests/test_numerics_runs.py tests/test_numerics.py \
              tests/test_numerics_notebook.py -m "gpu or not slow" ;;
  chaintime) step chaintime 560 python3 benchmarks/bench_chain_time.py --out $RES/chaintime --device cuda --cases ${CASES:-builtin,healthy,failing} ;;
  seeds)    step seeds ${SEEDS_LIMIT:-580} python3 -m pytest -q -p no:cacheprovider -p no:randomly -rs \
              --basetemp=$RES/seeds/t ${SEEDS_ARGS:+$SEEDS_ARGS --dist loadgroup} tests/test_seeds_gpu.py ${SEEDS_K:+-k "$SEEDS_K"} ;;   # the seeds' scenarios, whole chains
  two)      step two 500 python3 -m pytest -q -p no:cacheprovider -rs -m gpu -n 4 --dist loadfile --basetemp=$RES/two/t \
              tests/test_jobs.py tests/test_fsdp_job.py tests/test_watch_long.py tests/test_fixes.py tests/test_numerics_runs.py ;;  # 2 GPUs
  fpgpu)    step fpgpu 300 python3 -m pytest -q -p no:cacheprovider -rs tests/test_fingerprints_gpu.py ;;
  nangpu)   step nangpu 300 python3 -m pytest -q -p no:cacheprovider -rs -m gpu tests/test_nan_cause_recorded.py ;;
  tf32)     step tf32 400 python3 -m pytest -q -p no:cacheprovider -rs -n 3 tests/test_numerics_gpu.py -k "tf32 or gpt" ;;
  bct)      step bct 560 python3 benchmarks/bench_compare_time.py --out $RES/bct --device cuda ${BCT_CASES:+--cases $BCT_CASES} ;;
  setupchain) step setupchain 400 bash -c 'python3 -c "from gpulab.trace import native; native.ensure_all()" && \
              python3 benchmarks/bench_chain_time.py --out $0 --device cuda --cases builtin' $RES/setupchain ;;
  sbs)      step sbs 300 python3 benchmarks/bench_chain_time.py --out $RES/sbs --device cuda --cases builtin ;;   # as the machine allows
  pair)     step pair 400 bash -c 'CUDA_CACHE_PATH=$0/ccA python3 benchmarks/bench_chain_time.py --out $0/a --device cuda --cases builtin && \
              CUDA_CACHE_PATH=$0/ccB GPULAB_NOTEBOOKS_SIDE_BY_SIDE=0 python3 benchmarks/bench_chain_time.py --out $0/b --device cuda --cases builtin' $RES/pair ;;
  *) echo "unknown step $s" ;;
esac; done
sleep 3  # guards of children that just ended finish their last sweep (about 1 s) before the check
ps -eo pid,ppid,etime,cmd | grep -E "gpulab|python" | grep -v grep > $RES/leftover_processes.txt
# Only the small text products come back (a reply carries 16 MiB per file).
(cd $RES && find . -type f -size -3M \( -name '*.json' -o -name '*.csv' -o -name '*.txt' -o -name '*.yaml' \
   -o -name '*.log' -o -name '*.py' -o -name '*.md' -o -name '*.html' \) -print0 \
   | tar czf "${OUT:-/tmp}/gpuv-$(IFS=-; echo "$*").tgz" --null -T -)
cat $RES/steps.txt
