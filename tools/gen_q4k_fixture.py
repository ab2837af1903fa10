#!/usr/bin/env python3
"""Q4_K fixture from llama.cpp's own reference quantizer (the oracle the gguf package lacks).

The gguf package (gguf/quants.py) has no Q4_K quantizer. llama.cpp's reference one,
quantize_row_q4_K_ref in ggml/src/ggml-quants.c, ships in the llama-cpp-python source
distribution on PyPI (DESIGN.md: used for comparison only, never committed or linked). This script
downloads that sdist (pip), compiles ggml-quants.c with a 20-line driver (gcc -O2
-ffp-contract=off: the reference arithmetic, unfused, as dspark's build), quantizes the blocks of
q4k_inputs() and writes tests/fixtures/quant/q4_k-llamacpp.json: the 144-byte blocks in hex.
tests/py/test_dequant.py regenerates the same inputs (numpy, seeded) and compares dspark's Q4_K
quantizer byte for byte.

usage: tools/gen_q4k_fixture.py [--sdist llama_cpp_python-X.tar.gz]   (needs gcc, numpy, pip)
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import tarfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "build", "q4k-oracle")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "quant", "q4_k-llamacpp.json")
SDIST = "llama-cpp-python==0.3.36"

DRIVER = r"""
#include "ggml-quants.h"
#include <stdio.h>
#include <stdlib.h>
/* never called by quantize_row_q4_K_ref; ggml-quants.c refers to them elsewhere */
void ggml_abort(const char *file, int line, const char *fmt, ...) { (void)file; (void)line; (void)fmt; abort(); }
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void)type; (void)ne; abort(); }
size_t ggml_type_size(enum ggml_type type) { (void)type; abort(); }
const char *ggml_type_name(enum ggml_type type) { (void)type; abort(); }
int main(void) {
    float x[256];
    block_q4_K y;
    while (fread(x, sizeof x, 1, stdin) == 1) {
        quantize_row_q4_K_ref(x, &y, 256);
        fwrite(&y, sizeof y, 1, stdout);
    }
    return 0;
}
"""


def q4k_inputs() -> np.ndarray:
    """(n_blocks, 256) float32: the shapes weights come in, and the edge cases of the search."""
    rng = np.random.default_rng(20240615)
    blocks = []
    for sigma in (1e-3, 0.02, 0.1, 1.0, 30.0):  # Gaussian weights of several scales
        blocks += list(rng.normal(0, sigma, (6, 256)))
    blocks += list(rng.uniform(-1, 1, (4, 256)))
    blocks += list(rng.uniform(0.5, 2.0, (4, 256)))        # all positive: the min is clipped to 0
    blocks += list(-rng.uniform(0.5, 2.0, (4, 256)))       # all negative
    b = rng.normal(0, 0.05, (4, 256))
    b[:, ::37] *= 40                                        # outliers in some sub-blocks
    blocks += list(b)
    b = rng.normal(0, 1, (4, 256)) * (rng.uniform(size=(4, 256)) < 0.1)  # sparse
    blocks += list(b)
    b = rng.normal(0, 1, (4, 256)) * np.repeat(10.0 ** rng.uniform(-4, 1, (4, 8)), 32, axis=1)  # sub-block scales differ
    blocks += list(b)
    blocks += [np.zeros(256), np.full(256, 0.25), np.full(256, -3.0), np.arange(256) % 16, np.arange(256) - 128.0]
    b = rng.normal(0, 1e-20, (2, 256))                      # tiny values
    blocks += list(b)
    x = np.asarray(blocks, dtype=np.float32)
    # most weights arrive as bf16: round half of the blocks to bf16 values
    bits = x.view(np.uint32).astype(np.uint64)
    bf = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    x[::2] = bf[::2]
    return x


def build(sdist: str | None) -> str:
    os.makedirs(WORK, exist_ok=True)
    if not sdist:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", SDIST, "-d", WORK], check=True)
        sdist = sorted(glob.glob(os.path.join(WORK, "llama_cpp_python-*.tar.gz")))[-1]
    src = os.path.join(WORK, "src")
    with tarfile.open(sdist) as t:
        members = [m for m in t.getmembers() if "/vendor/llama.cpp/ggml/" in m.name and m.name.endswith((".h", ".c"))
                   and ("/ggml/include/" in m.name or "/ggml/src/ggml-" in m.name)]
        t.extractall(src, members=members, filter="data")
    ggml = glob.glob(os.path.join(src, "*", "vendor", "llama.cpp", "ggml"))[0]
    with open(os.path.join(WORK, "driver.c"), "w") as f:
        f.write(DRIVER)
    exe = os.path.join(WORK, "q4k_oracle")
    subprocess.run(["gcc", "-std=c11", "-O2", "-ffp-contract=off", "-I", os.path.join(ggml, "include"), "-I", os.path.join(ggml, "src"),
                    "-I", os.path.join(ggml, "src", "ggml-cpu"), os.path.join(WORK, "driver.c"), os.path.join(ggml, "src", "ggml-quants.c"),
                    "-o", exe, "-lm"], check=True)
    return exe, os.path.basename(sdist)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sdist", help="a llama_cpp_python-*.tar.gz already downloaded")
    a = ap.parse_args()
    exe, name = build(a.sdist)
    x = q4k_inputs()
    out = subprocess.run([exe], input=x.tobytes(), capture_output=True, check=True).stdout
    assert len(out) == 144 * len(x)
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    with open(FIXTURE, "w") as f:
        json.dump({"oracle": f"quantize_row_q4_K_ref from llama.cpp's ggml-quants.c in {name}, gcc -O2 -ffp-contract=off",
                   "inputs": "tools/gen_q4k_fixture.py q4k_inputs()", "inputs_sha256": hashlib.sha256(x.tobytes()).hexdigest(),
                   "n_blocks": len(x), "blocks_hex": [out[i:i + 144].hex() for i in range(0, len(out), 144)]}, f, indent=1)
        f.write("\n")
    print(f"{FIXTURE}: {len(x)} blocks", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
