#!/usr/bin/env bash
# The side-by-side anchor (DESIGN.md §5 "speed"): llama.cpp's llama-bench and llama-lookup, CPU
# only, built from the source that ships inside the PyPI sdist of llama-cpp-python, under
# bench/.llamacpp/ (git-ignored). For comparison only: nothing of it is committed, linked into,
# or needed by dspark. bench/compare_llamacpp.py runs the result next to `dspark benchmark`.
#
#   bench/build_llamacpp.sh [VERSION]        # default 0.3.36; prints the bin directory
#
# CPU variant (LLAMACPP_CPU): "avx512" (default when this CPU has AVX512-VNNI: AVX2, FMA, F16C,
# AVX512F/VBMI/VNNI/BF16 and AVX-VNNI if present -- a binary that also runs on the device's Xeon),
# "avx2" (AVX2, FMA, F16C) or "native" (-march=native, this machine only). No AMX: the binary is
# meant to run where dspark's kernels run, and AMX would need a separate variant. Static, OpenMP
# thread pool (llama.cpp's default), weight repacking on (its default, GGML_CPU_REPACK).
# LLAMACPP_CUDA=1: the CUDA backend too (sm_90, the lent H100/H200; CMAKE_CUDA_ARCHITECTURES from
# LLAMACPP_CUDA_ARCH), CPU part avx2, into build-VERSION-cuda: llama-bench and llama-batched-bench
# for issue 12's side-by-side on the GPU (bench/compare_llamacpp.py --backend cuda). Compiled here
# (nvcc, no GPU needed); shared libraries (libggml-cuda.so and friends) beside the binaries, so that
# the whole bin/ folder is carried to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")"
VERSION=${1:-0.3.36}
ROOT=$PWD/.llamacpp
SRC=$ROOT/llama_cpp_python-$VERSION/vendor/llama.cpp
PY=${PYTHON:-$(command -v python3)}
[ -x ../.venv/bin/python ] && PY=../.venv/bin/python
mkdir -p "$ROOT"
if [ ! -f "$ROOT/llama_cpp_python-$VERSION.tar.gz" ]; then
  # pip is the ordinary client of PyPI; --no-binary fetches the sdist (the source), no wheel
  "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$ROOT" >&2
fi
[ -d "$SRC" ] || tar -xzf "$ROOT/llama_cpp_python-$VERSION.tar.gz" -C "$ROOT"

cpu=${LLAMACPP_CPU:-}
[ -z "$cpu" ] && [ "${LLAMACPP_CUDA:-0}" = 1 ] && cpu=avx2  # the GPU does the work; runs on any x86-64 host
if [ -z "$cpu" ]; then
  if grep -qw avx512_vnni /proc/cpuinfo; then cpu=avx512; else cpu=avx2; fi
fi
opts=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
case "$cpu" in
  native) opts=(-DGGML_NATIVE=ON) ;;
  avx2) ;;
  avx512)
    opts+=(-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON)
    grep -qw avx_vnni /proc/cpuinfo && opts+=(-DGGML_AVX_VNNI=ON) ;;
  *) echo "build_llamacpp: LLAMACPP_CPU='$cpu' is not native, avx2 or avx512" >&2; exit 2 ;;
esac
BUILD=$ROOT/build-$VERSION-$cpu
gpu=(-DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=OFF)
targets=(llama-bench llama-lookup)
if [ "${LLAMACPP_CUDA:-0}" = 1 ]; then
  [ "$cpu" = native ] && { echo "build_llamacpp: the CUDA variant runs elsewhere: not with LLAMACPP_CPU=native" >&2; exit 2; }
  BUILD=$ROOT/build-$VERSION-cuda
  gpu=(-DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${LLAMACPP_CUDA_ARCH:-90}"
       -DCMAKE_BUILD_RPATH='$ORIGIN' -DCMAKE_INSTALL_RPATH='$ORIGIN'
       -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined)  # libcuda.so.1 (the driver) is on the GPU machine only
  targets=(llama-bench llama-batched-bench)
  cpu=$cpu+cuda
fi
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_METAL=OFF "${gpu[@]}" \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_TOOLS=ON "${opts[@]}" >&2
cmake --build "$BUILD" --target "${targets[@]}" -j "${JOBS:-2}" >&2
echo "$cpu" > "$BUILD/bin/CPU_VARIANT"
echo "$BUILD/bin"
