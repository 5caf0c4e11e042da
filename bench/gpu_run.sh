#!/usr/bin/env bash
# The prepared GPU measurements (issue 37), on a lent GPU machine, with the kit of bench/gpu_kit.sh; three parts, in
# the order they matter, each meant to end within the device tool's 10 minutes a command:
#
#   bash bench/gpu_run.sh gpu       # bench.gpu: every path and stage, inputs on every core, one model process
#   bash bench/gpu_run.sh mask      # the [MASK] stage on a synthetic dump's mentions at 512 and 128 tokens
#   bash bench/gpu_run.sh workers   # parse, dictionary and mentions at 4, 8 and 16 workers, on the dump and on one
#                                   # a quarter its size (how the part that is not parallel shrinks with the dump)
#
# With a session's 15 minutes of device time (the machine's start ~30 s; it is given back 30 s after a command
# ends, so the next command must follow at once): first one command of at most 600 s,
#   export GPU_RUN_CEILING_SECONDS=6; bash bench/gpu_run.sh gpu; GPU_RUN_ARTICLES=10000 GPU_RUN_MENTIONS_512=0 \
#     bash bench/gpu_run.sh mask         # ~155,000 mentions: the stage end to end on more than 100,000
# then, with the time left as its limit, `bash bench/gpu_run.sh workers` (what it finishes comes back in $OUT).
# Build and check the kit first (bench/gpu_kit.sh with KIT_CHECK_PYTHON): a kit that fails there costs the run.
#
# Every output is written to $OUT (the folder the device tool brings back; ./gpu-run here) as well as printed.
# The kit is unpacked into GPU_RUN_SITE (default /tmp/site) when Beam, spaCy or FAISS does not import.
# GPU_RUN_ARTICLES (default 40,000) sizes the synthetic dump (GPU_RUN_MENTIONS_512, default 200,000, how many of
# its mentions the 512-token stage encodes; 0: all), GPU_RUN_DEVICE (default cuda) the device:
# `GPU_RUN_DEVICE=cpu GPU_RUN_ARTICLES=500` runs the same steps with the same model on a CPU, small (what
# bench/gpu_kit.sh's check rehearses).
set -euo pipefail
[ -f pyproject.toml ] || { echo "run this in the project root" >&2; exit 2; }
PART=${1:?which part: gpu, mask or workers}
OUT=${OUT:-$PWD/gpu-run}
WORK=${GPU_RUN_WORK:-/tmp/kpr-gpu-run}
ARTICLES=${GPU_RUN_ARTICLES:-40000}
DEVICE=${GPU_RUN_DEVICE:-cuda}
CORES=$(nproc)
PASSAGES=psgs_w100_subset_from_haystack_nqdev.tsv
mkdir -p "$OUT" "$WORK"

KIT_IMPORTS="import apache_beam, faiss, spacy; spacy.blank('en')"  # what the stages need beside torch
SITE=${GPU_RUN_SITE:-/tmp/site}
if ! python3 -c "$KIT_IMPORTS" 2>/dev/null; then  # unpacked once, for every part after
  [ -d "$SITE/apache_beam" ] || { mkdir -p "$SITE" && tar -xJf .gpu-kit/site.tar.xz -C "$SITE"; }
  export PYTHONPATH=$SITE:$PWD/.gpu-kit/stub${PYTHONPATH:+:$PYTHONPATH}
  python3 -c "$KIT_IMPORTS" || { echo "the kit does not import" >&2; exit 3; }
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
# bench.paths reads ../shared/data, else shared/data in the checkout: the real DPR passages go there when neither has them
if [ -f ".gpu-kit/$PASSAGES" ] && [ ! -f "../shared/data/passages/$PASSAGES" ] && [ ! -f "shared/data/passages/$PASSAGES" ]; then
  mkdir -p shared/data/passages && cp ".gpu-kit/$PASSAGES" shared/data/passages/
fi
if [ "$DEVICE" = cpu ]; then  # the same model on the CPU (a rehearsal): counts that keep each step to a few minutes
  MODEL=(--device cpu --model random-bert-base --mentions 32 --passages 64 --path-mentions 32 --ceiling-seconds 1)
  AT_512=(--mentions 32) AT_128=(--mentions 32)
else  # at least 100,000 mentions for the stage end to end; 0: every mention of the dump, in its own OUT
  MODEL=(--device "$DEVICE" --dtype bfloat16 --model random-bert-base --batch-tokens 65536
         --ceiling-seconds "${GPU_RUN_CEILING_SECONDS:-10}")
  AT_512=(--mentions "${GPU_RUN_MENTIONS_512:-200000}") AT_128=(--mentions 0)
fi
EVERY_CORE=(--beam=--direct_running_mode=multi_processing "--beam=--direct_num_workers=$CORES")
# bench.scale's outputs are named after the checkout's folder
MENTIONS_OUT=$WORK/out/$(basename "$PWD")/a$ARTICLES-w$CORES

run() {  # run NAME COMMAND...: the command's output printed and kept as $OUT/NAME.txt, with the time it took
  echo "== $1: ${*:2} (load $(cut -d' ' -f1 /proc/loadavg))" | tee "$OUT/$1.txt"
  local started=$SECONDS
  "${@:2}" 2>&1 | tee -a "$OUT/$1.txt"
  echo "== $1: $((SECONDS - started)) s" | tee -a "$OUT/$1.txt"
}

case $PART in
  gpu)
    (nvidia-smi -L 2>/dev/null || echo "no nvidia-smi") | tee "$OUT/device.txt"
    run gpu python3 -m bench.gpu "${MODEL[@]}" "${EVERY_CORE[@]}" --work "$WORK/sample"
    ;;
  mask)
    run synthetic-mentions python3 -m bench.scale --articles "$ARTICLES" --workers "$CORES" \
      --stages parse dictionary mentions --max-seq-length 512 --work "$WORK"
    run mask-512 python3 -m bench.gpu "${MODEL[@]}" "${EVERY_CORE[@]}" --work "$WORK/sample" \
      --mentions-out "$MENTIONS_OUT" --paths mentions --lengths 512 "${AT_512[@]}"
    run mask-128 python3 -m bench.gpu "${MODEL[@]}" "${EVERY_CORE[@]}" --work "$WORK/sample" \
      --mentions-out "$MENTIONS_OUT" --paths mentions --lengths 128 "${AT_128[@]}"
    ;;
  workers)
    # 1 worker took ~15 minutes at 40,000 articles on the H100 server (README "More workers"): past a command's 10
    run workers python3 -m bench.scale --articles "$ARTICLES" $((ARTICLES / 4)) --workers 4 8 16 \
      --stages parse dictionary mentions --work "$WORK" --json "$OUT/workers.json"
    ;;
  *) echo "unknown part $PART: gpu, mask or workers" >&2; exit 2 ;;
esac
