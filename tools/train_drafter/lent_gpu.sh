#!/usr/bin/env bash
# The default drafter's training on a GPU lent one short command at a time (tools/train_drafter/
# LENT_GPU.md: 10 minutes a call, at most 64 MB of the checkout + carried paths travel with each).
#
# Here, once:
#   tools/train_drafter/lent_gpu.sh prepare [TRAIN_DRAFTER_PROMPT_OPTIONS...]
#       into build/lent/ (ignored): the dspark CUDA kit (scripts/gpu-kit, xz), the gguf wheel, the
#       prompts (train_drafter.py --steps prompts, default --n-debian 20000 --n-python 3000), the
#       target in three parts and its sha256; prints what each call must carry
# There, one call each, back to back (a warm machine keeps /dev/shm and /tmp ~30 s after a call):
#   tools/train_drafter/lent_gpu.sh stage 0|1     copy part 0 (+ kit, wheel) / part 1 (+ prompts)
#   tools/train_drafter/lent_gpu.sh data [OPTS]   part 2: join, check, then magpie + data
#   tools/train_drafter/lent_gpu.sh train [OPTS]  train, eval, core export to $OUT/core (+ metrics
#                                                 and the log as $OUT/trainlog.tgz), then the full
#                                                 drafter in /dev/shm/d if the call has time
#   tools/train_drafter/lent_gpu.sh bench         bench_spec --backend cuda on /dev/shm/d
# Each step is scripts/train-default-drafter's recipe (--gpu-part; prepare: --steps prompts); OPTS
# are train_drafter.py options after it (e.g. --n-magpie 14000, --train-seconds 400).
# Env: TARGET (default the default model), LENT (default build/lent), CALL_S (a call's limit, 600).
# Back here: copy the returned core/ somewhere writable, untar trainlog.tgz into it (metrics.json,
# train_log.jsonl: a call returns at most 8 files), then scripts/train-default-drafter --finish DIR.
# Stop 48 smoke-tested prepare, stage, data and train on a CPU, before and after the steps became
# the recipe script (PATH with .venv-drafters' python, DSPARK_ARGS="-t 2 --max-batch 16", tiny
# budgets); bench needs a GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$SECONDS
el() { echo "[$((SECONDS - T0)) s] $*"; }
L=${LENT:-build/lent}
S=/dev/shm/st W=/dev/shm/w
TD=tools/train_drafter/train_drafter.py
RECIPE=scripts/train-default-drafter
CALL_S=${CALL_S:-600}
cmd=${1:-}; shift || true
left() { echo $((CALL_S - 15 - (SECONDS - T0))); }  # seconds this call has left, with a margin
warm() { ls "$@" >/dev/null 2>&1 || { echo "lent_gpu: $* missing: the machine is not the warm one of the last call" >&2; exit 3; }; }
site() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$S"/gguf-*.whl 2>/dev/null
         export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/tmp/k/.gpukit/lib; }

case "$cmd" in
  prepare)
    set -e
    PY=${PYTHON:-.venv-drafters/bin/python}
    TARGET=${TARGET:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
    mkdir -p "$L"
    scripts/gpu-kit "$L/kit/.gpukit" >/dev/null
    tar cf - -C "$L/kit" .gpukit | xz -9e > "$L/K.tar.xz" && rm -rf "$L/kit"
    rm -f "$L"/gguf-*.whl
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux_2_28_x86_64 -d "$L" gguf==0.19.0
    rm -rf "$L/w" && PYTHON="$PY" TARGET="$TARGET" WORK="$L/w" $RECIPE --gpu-part "$L/w" --steps prompts "$@"
    xz -9 -c "$L/w/prompts.jsonl" > "$L/prompts.jsonl.xz" && rm -rf "$L/w"
    # bytes [0, 45 M), [45 M, 93.5 M), the rest: each part beside the ~15 MB tree stays under 64 MB
    dd if="$TARGET" of="$L/part0" bs=500000 count=90 status=none
    dd if="$TARGET" of="$L/part1" bs=500000 skip=90 count=97 status=none
    dd if="$TARGET" of="$L/part2" bs=500000 skip=187 status=none
    sha256sum "$TARGET" | cut -d' ' -f1 > "$L/sha256"
    ls -la "$L"
    echo "carry, call by call: stage 0: $L/part0 $L/K.tar.xz $L/gguf-0.19.0-py3-none-any.whl"
    echo "                     stage 1: $L/part1 $L/prompts.jsonl.xz"
    echo "                     data:    $L/part2 $L/sha256"
    echo "                     train, bench: nothing" ;;
  stage)
    mkdir -p $S
    case "${1:-}" in
      0) cp "$L/part0" "$L/K.tar.xz" "$L"/gguf-*.whl $S/ ;;
      1) warm $S/part0 && cp "$L/part1" "$L/prompts.jsonl.xz" $S/ ;;
      *) echo "lent_gpu: stage 0|1" >&2; exit 2 ;;
    esac
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null; ls -la $S ;;
  data)
    warm $S/part0 $S/part1 $S/prompts.jsonl.xz
    cat $S/part0 $S/part1 "$L/part2" > $S/target.gguf && rm -f $S/part0 $S/part1
    echo "$(cat "$L/sha256")  $S/target.gguf" | sha256sum -c || exit 4
    mkdir -p /tmp/k $W && tar xJf $S/K.tar.xz -C /tmp/k && xz -dc $S/prompts.jsonl.xz > $W/prompts.jsonl
    site
    PYTHON=python3 TARGET=$S/target.gguf WORK=$W timeout "$(left)" $RECIPE --gpu-part "$OUT" --steps magpie,data \
      --dspark /tmp/k/.gpukit/bin/dspark ${DSPARK_ARGS:+--dspark-args "$DSPARK_ARGS"} --data-seconds 400 "$@" > "$OUT/data.log" 2>&1
    el "data rc $?"; grep -v "it/s\]" "$OUT/data.log" | tail -6
    xz -9 -c $W/prompts.jsonl > "$OUT/prompts.jsonl.xz"; du -sh $W/data ;;
  train)
    warm $S/target.gguf $W/data
    site
    rm -rf $W/ckpt $W/train_log.jsonl
    PYTHON=python3 TARGET=$S/target.gguf WORK=$W timeout "$(left)" $RECIPE --gpu-part "$OUT/core" --steps train,eval,export \
      "$@" > "$OUT/train.log" 2>&1
    el "train rc $?"; grep -v "it/s\]" "$OUT/train.log" | grep "done\|eval:\|Error" | tail -4
    # a call returns at most 8 files: the 4 shards, config and vocabulary, train.log, and the rest in one tar
    tar czf "$OUT/trainlog.tgz" -C $W metrics.json train_log.jsonl 2>/dev/null; rm -f "$OUT/core/metrics.json" "$OUT/core/train_log.jsonl"
    if [ "$(left)" -gt 60 ]; then
      timeout "$(left)" python3 $TD --target $S/target.gguf --work $W --steps export --core "$OUT/core" --out /dev/shm/d \
        > /tmp/assemble.log 2>&1
      el "assemble rc $?"
    else
      el "no time left to assemble /dev/shm/d: the bench call cannot run"
    fi ;;
  bench)
    warm $S/target.gguf /dev/shm/d/model.safetensors
    export LD_LIBRARY_PATH=/tmp/k/.gpukit/lib
    timeout "$(left)" /tmp/k/.gpukit/bin/bench_spec -m $S/target.gguf --draft-model /dev/shm/d --backend cuda -n 128 \
      --reps "${REPS:-1}" --sets heldout-chat,heldout-code,copy --mode lookup,dspark,auto --max-draft auto --json \
      > "$OUT/spec-gpu.json" 2> "$OUT/spec-gpu.err"
    el "bench rc $?"; tail -20 "$OUT/spec-gpu.err" ;;
  *) sed -n "2,/^set -uo/p" "$0" | sed "\$d"; [ "$cmd" = -h ] || [ "$cmd" = --help ]; exit $? ;;
esac
