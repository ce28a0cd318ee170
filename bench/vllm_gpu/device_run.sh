#!/usr/bin/env bash
# One device call: assemble the carried vLLM 0.23.0 site (if its parts are all there), then serve
# each named engine with harness.py on its plan, each result packed as one file under $OUT.
#
#   bash bench/vllm_gpu/device_run.sh [ENGINE ...]        (ENGINE: a name from the table below)
#
# The site (vLLM's wheel trimmed + the dependencies the device lacks, bench/vllm_gpu/README.md)
# travels in parts of .vllm_carry/ over several calls; each call moves what it finds to
# /tmp/kvsim_parts, so a later call on the same warm machine finds the earlier parts.
set -u
PY=${PY:-/opt/torch/.venv/bin/python3}
PARTS=/tmp/kvsim_parts
SITE=/tmp/kvsim_site
OUT=${OUT:-/tmp/kvsim_out}
PLANS=${PLANS:-.vllm_plans}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$PARTS" "$OUT"
for f in .vllm_carry/part_* .vllm_carry/sha256; do [ -f "$f" ] && mv -f "$f" "$PARTS/"; done
echo "parts here: $(cd $PARTS && ls | tr '\n' ' ')"
if [ ! -f "$SITE/.ok" ] && [ -f "$PARTS/sha256" ] && [ -f "$PARTS/part_02" ]; then
  cat "$PARTS"/part_0* > /tmp/site.tar.xz
  (cd /tmp && echo "$(cut -d' ' -f1 "$PARTS/sha256")  site.tar.xz" | sha256sum -c -) || exit 3
  rm -rf /tmp/site && tar -xJf /tmp/site.tar.xz -C /tmp && rm -rf "$SITE" && mv /tmp/site "$SITE" \
    && touch "$SITE/.ok" && rm -f /tmp/site.tar.xz
  echo "site unpacked: $(du -sh $SITE | cut -f1)"
fi
[ $# -eq 0 ] && { nvidia-smi --query-gpu=name,clocks.sm,power.draw,memory.used --format=csv; exit 0; }
[ -f "$SITE/.ok" ] || { echo "site not assembled yet"; exit 4; }

export PYTHONPATH="$SITE:$HERE:$HERE/plugin${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_LOGGING_LEVEL=INFO
export VLLM_CONFIGURE_LOGGING=1 TOKENIZERS_PARALLELISM=false
# one Triton disk cache for every engine on the machine: an engine that compiles its torch.compile
# graph sends Triton to Inductor's cache folder, one that loads them from vLLM's compile cache to
# ~/.triton/cache, so a second engine missed every kernel the first compiled (gpt-oss-20b-cached,
# 2026-12-07; found with the probe's triton_cache record). Set, the second loads them (1-5 ms each:
# gpt-oss-20b-cached2), and a keys warm-up can be spread over engines on one warm machine.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/root/.cache/kvsim_triton}

if [ ! -f /tmp/kvsim_smoke_ok ]; then
  "$PY" - <<'PYEOF' && touch /tmp/kvsim_smoke_ok
import importlib, importlib.metadata as md, sys
bad = []
for m in ("vllm", "vllm.v1.engine.async_llm", "vllm.model_executor.layers.quantization.fp8",
          "vllm.model_executor.layers.fused_moe", "vllm.model_executor.layers.quantization.mxfp4",
          "vllm.v1.attention.backends.flash_attn", "kvsim_vllm_probe"):
    try:
        importlib.import_module(m)
    except Exception as err:  # noqa
        bad.append(f"{m}: {type(err).__name__}: {err}")
eps = [e.name for e in md.entry_points(group="vllm.general_plugins")]
print("smoke: plugins", eps, "problems:", bad or "none")
sys.exit(1 if bad else 0)
PYEOF
fi

engine() {  # name -> "model_dir plan flags..."
  case "$1" in
    llama8b-bf16)         echo "Llama-3.1-8B smallm" ;;
    llama8b-bf16-noasync) echo "Llama-3.1-8B noasync --no-async" ;;
    llama8b-fp8)          echo "Llama-3.1-8B small --quantization fp8 --kv-cache-dtype fp8" ;;
    qwen3-30b-a3b)        echo "Qwen3-30B-A3B small" ;;
    qwen3-30b-a3b-noasync) echo "Qwen3-30B-A3B noasync --no-async" ;;   # with -wave: the wave plan, async off
    gpt-oss-20b)          echo "gpt-oss-20b small" ;;
    qwen3-32b)            echo "Qwen3-32B large" ;;
    llama70b-fp8)         echo "Llama-3.1-70B large --quantization fp8 --kv-cache-dtype fp8" ;;
    gpt-oss-120b)         echo "gpt-oss-120b large" ;;
    # the fine grid alone (plans.py --size fine --only grid > fine.json)
    llama8b-bf16-fine)    echo "Llama-3.1-8B fine" ;;
    qwen3-30b-a3b-fine)   echo "Qwen3-30B-A3B fine" ;;
    gpt-oss-20b-fine)     echo "gpt-oss-20b fine" ;;
    llama8b-fp8-fine)     echo "Llama-3.1-8B fine --quantization fp8 --kv-cache-dtype fp8" ;;
    # each workload served twice in one engine (plans.py --again > twice.json)
    gpt-oss-20b-twice)    echo "gpt-oss-20b twice" ;;
    gpt-oss-120b-twice)   echo "gpt-oss-120b twice" ;;
    # the same after a warm-up over prompt lengths (harness.py --warmup-lengths)
    gpt-oss-20b-warm)     echo "gpt-oss-20b twice --warmup-lengths" ;;
    gpt-oss-120b-warm)    echo "gpt-oss-120b twice --warmup-lengths" ;;
    # the jit plan served once (keys.json) after a warm-up over every eager step's compile key
    # (harness.py --warmup-eager-keys), cut after $KEYS_S seconds (330: a 10-minute call)
    gpt-oss-20b-keys)     echo "gpt-oss-20b keys --warmup-eager-keys --warmup-eager-keys-s ${KEYS_S:-330}" ;;
    gpt-oss-120b-keys)    echo "gpt-oss-120b keys --warmup-eager-keys --warmup-eager-keys-s ${KEYS_S:-330}" ;;
    # the same, the warm-up only over the eager steps earlier runs of the plan met
    # (plans.py --eager-steps-of ... > $PLANS/eager_steps.json): gpt-oss-120b's 448 keys take ~14 min
    gpt-oss-20b-keysof)   echo "gpt-oss-20b keys --warmup-eager-keys --warmup-eager-keys-of ${EAGER_STEPS:-$PLANS/eager_steps.json} --warmup-eager-keys-s ${KEYS_S:-330}" ;;
    gpt-oss-120b-keysof)  echo "gpt-oss-120b keys --warmup-eager-keys --warmup-eager-keys-of ${EAGER_STEPS:-$PLANS/eager_steps.json} --warmup-eager-keys-s ${KEYS_S:-330}" ;;
    # the fine grid alone on an engine that compiled the grid's eager steps first (EAGER_STEPS: plans.py
    # --eager-steps-of bench/results/vllm_h100/gpt-oss-20b-fine/grid), so that no prefill row of the
    # table compiled inside its step; its folder renamed ENGINE-fine for grid_table.py
    gpt-oss-20b-finekeys)  echo "gpt-oss-20b fine --warmup-eager-keys --warmup-eager-keys-of ${EAGER_STEPS:-$PLANS/eager_steps.json} --warmup-eager-keys-s ${KEYS_S:-330}" ;;
    gpt-oss-120b-finekeys) echo "gpt-oss-120b fine --warmup-eager-keys --warmup-eager-keys-of ${EAGER_STEPS:-$PLANS/eager_steps.json} --warmup-eager-keys-s ${KEYS_S:-330}" ;;
    # BASE-idle: lone prompts at an idle engine and C = 1 closed loops (plans.py --size idle >
    # idle.json); BASE-hot: lone prompts right after the last request finished (plans.py --size
    # hot > hot.json); BASE-burst: C prompts sent at once, four waves (plans.py --size burst >
    # burst.json); BASE-wave: the same waves after decode phases of several lengths (plans.py
    # --size wave > wave.json); BASE-start: one burst at an idle engine a workload (plans.py --size
    # start > start.json); BASE-rerun: held-out closed loops served again in a fresh engine
    # (plans.py --size small --only ... --rounds 6 > rerun.json); BASE-jit: held-out closed loops
    # served twice, each Triton compile timed (plans.py --only ... --again > jit.json), and
    # BASE-cached: the same plan (cached.json) in a second engine on the same machine, whose
    # kernels Triton finds in its disk cache; gpt-oss's with --again, in their own PLANS folder.
    # BASE's model and flags
    *-idle|*-hot|*-burst|*-wave|*-start|*-rerun|*-jit|*-cached)
      local plan=${1##*-} spec
      spec=$(engine "${1%-*}") || return 1
      set -- $spec
      echo "$1 $plan ${*:3}" ;;
    *) return 1 ;;
  esac
}

for name in "$@"; do
  spec=$(engine "$name") || { echo "unknown engine $name"; continue; }
  set -- $spec
  model=$1; plan=$2; shift 2
  run="/tmp/kvsim_runs/$name"
  rm -rf "$run" && mkdir -p "$run"
  t0=$(date +%s)
  timeout "${ENGINE_TIMEOUT_S:-330}" "$PY" "$HERE/harness.py" --model-dir "$HERE/configs/$model" \
    --name "$name" --plan "$PLANS/$plan.json" --out "$run" "$@" > "$run/vllm.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ -f "$run/meta.partial.json" ]; then
    "$PY" "$HERE/harness.py" --model-dir "$HERE/configs/$model" --name "$name" --plan "$PLANS/$plan.json" \
      --out "$run" --finish-only >> "$run/vllm.log" 2>&1
  fi
  echo "== $name rc=$rc $(( $(date +%s) - t0 )) s"
  grep -E "\[harness\]|Error|error:|Traceback" "$run/vllm.log" | tail -n 25
  (cd /tmp/kvsim_runs && tar -cJf "$OUT/$name.tar.xz" "$name")
done
ls -la "$OUT"
