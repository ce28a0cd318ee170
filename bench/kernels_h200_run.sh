#!/usr/bin/env bash
# The unified kernel's open targets (issue 14) measured in ONE device call on the H200: GPU
# correctness, the decode points side by side with the previous decode-only kernel (ABBA order),
# eager host cost against SDPA, mixed batches against two dense launches, prefill against the best
# dense kernel, and the dispatch-rule variants of bench/kernels_h200_plan.json.
#
# Here, on the CPU machine (copies the worktree into the main checkout's ignored .wt/NAME, which is
# what a device call carries; --precompile also fills a Triton cache of every kernel the run
# launches, about 10-20 minutes on 2 cores, so that the device measures instead of compiling):
#     bash bench/kernels_h200_run.sh prepare NAME [--precompile]
# Then one device call (kind nvidia-h200, carry [".wt/NAME"], timeout_s >= BUDGET_S + 150):
#     bash .wt/NAME/bench/kernels_h200_run.sh device [BUDGET_S] [PLAN]
# PLAN (a path inside the repository, default bench/kernels_h200_plan.json: the whole benchmark in
# priority order; bench/kernels_h200_plan_confirm.json: a shorter run that checks a rule change)
# BUDGET_S (default 300) is the measuring time (sections stop at their share of it; the points of
# each section are in the plan in priority order); the call adds the start (1-2 minutes of device time),
# the copy of the tree and, without a precompiled cache, about 2 minutes of compiles. $OUT gets
# kernels_h200.csv, kernels_h200_correctness.txt, env.txt, gpu.txt, log.txt and report.md
# (bench/kernels_report.py's tables); the summary is printed last.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
OLD_COMMIT=4dc92b1  # the previous decode-only paged_attention (kernels/attention.py)
PLAN=bench/kernels_h200_plan.json
CACHE=/tmp/kvsim_kernels_tcache  # the same absolute path here and there (Triton's cache records it)

case "${1:-}" in
prepare)
    name=${2:?usage: prepare NAME [--precompile]}
    main=$(git -C "$HERE" worktree list --porcelain | awk '/^worktree /{print $2; exit}')
    dest="$main/.wt/$name"
    grep -qx "/.wt/" "$main/.git/info/exclude" 2>/dev/null || echo "/.wt/" >> "$main/.git/info/exclude"
    rm -rf "$dest" && mkdir -p "$dest" || exit 1
    tar -C "$HERE" --exclude=./.venv --exclude=./.git --exclude=./runs --exclude=__pycache__ \
        --exclude=./triton_cache --exclude=./legacy_attention.py -cf - . | tar -C "$dest" -xf - || exit 1
    git -C "$HERE" show "$OLD_COMMIT:kernels/attention.py" > "$dest/legacy_attention.py" || exit 1
    if [ "${3:-}" = "--precompile" ]; then
        # record every launch with the project's venv, compile with the device's Triton and Python
        # (triton 3.6.0 under Python 3.12: Triton's cache key hashes its compiled extension)
        t36=${T36_PY312:?set T36_PY312 to a venv with triton==3.6.0 under Python 3.12}
        "$HERE/.venv/bin/python" "$HERE/bench/codegen_sm90.py" record --bench-plan "$HERE/$PLAN" \
            --old "$dest/legacy_attention.py" --out /tmp/kvsim_kernels_plan_launches.json || exit 1
        rm -rf "$CACHE"
        "$t36/bin/python" "$HERE/bench/codegen_sm90.py" precompile /tmp/kvsim_kernels_plan_launches.json \
            --old "$dest/legacy_attention.py" --cache "$CACHE" || exit 1
    fi
    # a cache of an earlier precompile travels too: entries of kernels changed since are never hit
    # (Triton keys them by source), those kernels compile on the device
    [ -d "$CACHE" ] && cp -r "$CACHE" "$dest/triton_cache"
    du -sh "$dest"
    ;;
device)
    budget=${2:-300}
    PLAN=${3:-$PLAN}
    export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
    out=${OUT:?OUT is set on the device machine}
    # the tree's kvsim/ folder would shadow an installed copy: a kvsim package under /tmp/site whose
    # sub-packages link to the tree, and the run from /tmp (DEVICE_RECIPE.md)
    rm -rf /tmp/site && mkdir -p /tmp/site && cp -r "$HERE/kvsim" /tmp/site/kvsim || exit 1
    for p in allocator kernels workloads simulator planner viz app_pages; do ln -s "$HERE/$p" "/tmp/site/kvsim/$p"; done
    export PYTHONPATH=/tmp/site
    if [ -d "$HERE/triton_cache" ]; then
        rm -rf "$CACHE" && cp -r "$HERE/triton_cache" "$CACHE" && export TRITON_CACHE_DIR=$CACHE
    fi
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu \
        --format=csv > "$out/gpu.txt" 2>&1
    cd /tmp || exit 1
    n0=$(ls "${TRITON_CACHE_DIR:-/nonexistent}" 2>/dev/null | wc -l)
    timeout $((budget + 120)) python3 "$HERE/bench/kernels.py" --out "$out" --budget-s "$budget" \
        --legacy "$HERE/legacy_attention.py" --no-flex --plan "$HERE/$PLAN" > "$out/log.txt" 2>&1
    rc=$?
    echo "bench/kernels.py rc=$rc; triton cache entries $n0 -> $(ls "${TRITON_CACHE_DIR:-/nonexistent}" 2>/dev/null | wc -l)"
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$out/gpu.txt" 2>&1
    python3 "$HERE/bench/kernels_report.py" "$out/kernels_h200.csv" > "$out/report.md" 2>&1
    grep -v "^  " "$out/log.txt" | tail -45
    exit $rc
    ;;
*)
    sed -n '2,17p' "$0"
    exit 2
    ;;
esac
