#!/usr/bin/env bash
# A/B of builds (or of environment settings) on a lent GPU machine, in one device call: decode of
# random-weight Qwen3-4B-shaped models, variants interleaved round by round so that they share the
# machine's state (clocks, other tenants), medians per variant and model, ratios to the first.
#
#   bench/gpu_ab.sh [-r ROUNDS] [-t TYPES] [-s SHAPE] [-b BACKEND] NAME=KIT[:VAR=VALUE,...] ...
#
# KIT is a directory made by scripts/gpu-kit (bin/dspark, lib/, py/) or a .tar.xz of one (its
# top-level folder is .gpukit); VAR=VALUE pairs are set for that variant only, e.g.
#   bench/gpu_ab.sh main=/tmp/k/main attn=/tmp/k/attn pipe3=/tmp/k/attn:DSP_CUDA_MM_PIPE=3
# TYPES: comma-separated weight types for tools/make_random_model.py (default bf16,q8_0,q4_k_m);
# SHAPE its --shape (default qwen3-4b); BACKEND dspark's --backend (default cuda; cpu tries the
# script on a machine without a GPU).
# PYTHON: the interpreter with numpy (default python3). Writes under $OUT (default ./gpu-ab):
# every run's JSON, summary.json and summary.txt.
# Nothing here is a test; the figures go to bench/results by hand, with the machine named.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 types=bf16,q8_0,q4_k_m shape=qwen3-4b backend=cuda
while getopts "r:t:s:b:" o; do
  case $o in
    r) rounds=$OPTARG ;;
    t) types=$OPTARG ;;
    s) shape=$OPTARG ;;
    b) backend=$OPTARG ;;
    *) sed -n 2,16p "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n 2,16p "$0" >&2; exit 2; }
out=${OUT:-gpu-ab}
mkdir -p "$out" /dev/shm/gpu-ab
names=() kits=() envs=()
for spec in "$@"; do
  name=${spec%%=*} rest=${spec#*=}
  kit=${rest%%:*} env=""
  [ "$rest" != "$kit" ] && env=${rest#*:}
  if [ -f "$kit" ]; then # a tarball: unpack once per path
    dir=/dev/shm/gpu-ab/kit-$(echo "$kit" | md5sum | cut -c1-8)
    [ -d "$dir" ] || { mkdir -p "$dir" && tar xJf "$kit" -C "$dir"; }
    kit=$dir/.gpukit
  fi
  [ -x "$kit/bin/dspark" ] || { echo "gpu_ab: $kit/bin/dspark is missing" >&2; exit 1; }
  names+=("$name") kits+=("$kit") envs+=("$env")
done
IFS=, read -ra tlist <<< "$types"
for t in "${tlist[@]}"; do # the models, once (the first kit's gguf package)
  m=/dev/shm/gpu-ab/$shape-$t.gguf
  [ -f "$m" ] || PYTHONPATH=${kits[0]}/py "${PYTHON:-python3}" tools/make_random_model.py --shape "$shape" --type "$t" --fast --out "$m"
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1 || true
for r in $(seq 1 "$rounds"); do
  for t in "${tlist[@]}"; do
    for i in "${!names[@]}"; do
      f=$out/${names[$i]}-$t-$r.json
      IFS=, read -ra ev <<< "${envs[$i]}"
      env "${ev[@]}" LD_LIBRARY_PATH="${kits[$i]}/lib" "${kits[$i]}/bin/dspark" benchmark -m /dev/shm/gpu-ab/$shape-$t.gguf --backend "$backend" \
        -r 3 --no-batched --no-prefill --bw-mb 0 --json > "$f" 2> "$out/${names[$i]}-$t-$r.err" || echo "gpu_ab: ${names[$i]} $t round $r failed" >&2
    done
  done
done
python3 - "$out" "$rounds" "$types" "${names[@]}" << 'EOF'
import json, statistics, sys
out, rounds, types, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4:]
summary, lines = {}, []
for t in types:
    base = None
    for n in names:
        runs = []
        for r in range(1, rounds + 1):
            try:
                runs.append(json.load(open(f"{out}/{n}-{t}-{r}.json"))["decode"]["tok_s"])
            except (OSError, ValueError, KeyError):
                pass
        med = statistics.median(runs) if runs else None
        base = med if base is None else base
        summary.setdefault(t, {})[n] = {"decode_tok_s_median": med, "runs": runs, "ratio_to_first": med / base if med and base else None}
        lines.append(f"{t:8s} {n:12s} decode {med or 0:8.1f} tok/s  x{(med / base) if med and base else 0:.3f}  runs {runs}")
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
open(f"{out}/summary.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
