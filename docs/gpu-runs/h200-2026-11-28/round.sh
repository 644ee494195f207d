#!/usr/bin/env bash
# How the GPU round of 2026-11-28 ran (one H200, ~6 minutes): run from the repository root with
# the cp312 wheels of pydantic, pydantic_core, annotated-types, typing-inspection,
# typing_extensions, protobuf, grpcio and grpcio-health-checking in .whl/ (see
# docs/benchmarks.md). $OUT is where the device tool collects files.
# GPU round 2: every GPU test, then gpu_engine, gpu_pd (with CUDA IPC), gpu_moe; logs under $OUT.
LIMIT=${LIMIT:-455}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PDSERVE_CACHE_DIR=/tmp/pdc TOKENIZERS_PARALLELISM=false
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
( python3 -c "
import time; from engine.builtin import resolve_model as r
for m in ('builtin:llama-1b', 'builtin:gpu-moe'):
    t=time.time(); r(m); print(m, round(time.time()-t,1), flush=True)
" > $OUT/write.log 2>&1 & )
el tests
timeout 150 python3 -m pytest tests/gpu tests/unit/roles/test_host_staging.py -q -n 8 -p no:cacheprovider \
  -p no:benchmark --timeout 100 -rfE --junitxml=$OUT/gpu-tests.xml > $OUT/tests.log 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|INTERNALERROR" $OUT/tests.log | cut -c1-300 | tail -40
cat $OUT/write.log
el engine
timeout 165 python3 benchmarks/gpu_engine.py --repeats 1 > $OUT/engine.json 2> $OUT/engine.err; echo "engine rc=$?"
grep -v "Processed prompts\|Loading weights" $OUT/engine.err | grep -iE "error|Traceback|warn" | tail -4
tail -c 2600 $OUT/engine.json; [ -s $OUT/engine.json ] || grep "so far" $OUT/engine.err | tail -1 | cut -c1-2600
el pd
timeout 80 python3 benchmarks/gpu_pd.py --repeats 1 > $OUT/pd.json 2> $OUT/pd.err; echo "pd rc=$?"
grep -v "^\[{" $OUT/pd.err | tail -5 | cut -c1-400; python3 -c "
import json; d=json.loads(open('$OUT/pd.json').read().strip().splitlines()[-1]); rows=d.pop('rows',[]); print(json.dumps(d))
for r in rows: print(r)" 2>&1 | tail -c 3500
el moe
timeout $(left) python3 benchmarks/gpu_moe.py --repeats 1 > $OUT/moe.json 2> $OUT/moe.err; echo "moe rc=$?"
grep -v "Processed prompts\|Loading weights" $OUT/moe.err | grep -iE "error|Traceback" | tail -4
tail -c 1500 $OUT/moe.json; [ -s $OUT/moe.json ] || grep "so far" $OUT/moe.err | tail -1 | cut -c1-1500
el done
