#!/bin/bash
# The hardware-in-the-loop session of docs/ACCURACY.md, on a GPU machine that has torch and triton
# but not simpy: run from the repository root with OUT set (what lands there is what comes back).
#
#   WHEELS=DIR (simpy's wheel)  TRACES=DIR (bench/accuracy.py excerpts)  DEADLINE_S=205  GRID_S=35  bench/hil_gpu.sh [ARGS]
#   (DRY_RUN=tiny_config.json: the same on the CPU, Triton interpreter, 2 requests a workload)
#
# kvsim is not pip-installed there: the tree's own kvsim/ folder would shadow an installed copy, so
# /tmp/site/kvsim is built from kvsim/ with links to the package folders, and Python runs from /tmp.
# One archive per workload lands in $OUT as soon as that workload ends (a run cut by its time limit
# still brings back the finished ones), then the context grid's rows as they are measured.
set -u
: "${OUT:?}" "${WHEELS:?}" "${TRACES:?}"
TREE=$PWD
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$WHEELS"/simpy-*.whl || exit 1
mkdir -p /tmp/site/kvsim && cp -r kvsim/. /tmp/site/kvsim/
for p in allocator kernels workloads simulator planner viz app_pages; do ln -sfn "$TREE/$p" "/tmp/site/kvsim/$p"; done
export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton, platform; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, 'python', platform.python_version())"
  date -u; } > "$OUT/env.txt" 2>&1
# more arguments go to `accuracy.py hil` (--grid-first, --grid-skip TABLE); LOG names the log
cd /tmp && python3 "$TREE/bench/accuracy.py" hil --traces "$TRACES" --out "$OUT" --work /tmp/hil \
    --only ${ONLY:-azure-conv sharegpt-rate16 mooncake} --deadline-s "${DEADLINE_S:-205}" \
    --context-grid-s "${GRID_S:-35}" ${DRY_RUN:+--dry-run "$DRY_RUN"} "$@" 2>&1 | tee "$OUT/${LOG:-hil.log}"
