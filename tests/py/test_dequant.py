"""Oracle test: core/quant's reference dequantization must be bit-exact against gguf-py.

The C side is tests/dequant_tool (built next to the tests, found through DSP_BUILD_DIR):
  * random blocks of every supported type, including f16 scales that are NaN, Inf, subnormal,
    zero and +-max, go through `dequant_tool raw TYPE N`;
  * every tensor of the real models goes through `dequant_tool gguf PATH`, which opens the file
    with our own GGUF reader (so names, types and element counts are cross-checked against
    gguf.GGUFReader too) and streams the f32 values; both sides work chunk by chunk.
Floats are compared as bit patterns; two NaNs count as equal whatever their payloads (numpy may
quiet a signalling NaN when it widens f16, and NaN*x keeps an unspecified payload).
"""
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf.quants import dequantize

# The types core/quant has a reference for; exactly these must have can_dequant set.
SUPPORTED = [QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0,
             QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_K]

# Byte offsets of the f16 scale fields inside one block, where special values are injected.
F16_FIELDS = {
    QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0], QT.Q5_1: [0, 2], QT.Q8_0: [0],
    QT.Q2_K: [80, 82], QT.Q3_K: [108], QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208],
}
F16_SPECIAL = [0x0000, 0x8000,                  # +-0
               0x0001, 0x8001, 0x0155, 0x03FF,  # subnormals
               0x0400, 0x3C00, 0xBC00, 0x3555,  # smallest normal, +-1, 1/3
               0x7BFF, 0xFBFF,                  # +-max
               0x7C00, 0xFC00,                  # +-inf
               0x7E00, 0xFE00, 0x7C01, 0x7DFF, 0xFFFF]  # quiet, signalling NaNs
F32_SPECIAL = [0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x3F800000, 0x7F7FFFFF,
               0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF]

MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
CHUNK_ELEMS = 1 << 20  # the tool's chunk; any multiple of 256 would do


def tool_path() -> Path:
    exe = os.environ.get("DEQUANT_TOOL")
    if exe:
        return Path(exe)
    build = os.environ.get("DSP_BUILD_DIR")
    if not build:
        pytest.skip("DSP_BUILD_DIR is not set (run through ctest)")
    exe = Path(build) / "tests" / "dequant_tool"
    if not exe.exists():
        pytest.fail(f"{exe} is missing: build the tests first")
    return exe


def reference(raw: np.ndarray, qtype: QT) -> np.ndarray:
    """gguf-py's dequantization; Q8_K is not implemented there, so its one-line formula is here."""
    with np.errstate(all="ignore"):
        if qtype == QT.Q8_K:
            try:
                return dequantize(raw, qtype).reshape(-1)
            except NotImplementedError:
                blocks = raw.reshape(-1, GGML_QUANT_SIZES[qtype][1])
                d = blocks[:, :4].copy().view(np.float32)
                qs = blocks[:, 4:260].view(np.int8).astype(np.float32)
                return (d * qs).reshape(-1)
        return dequantize(raw, qtype).reshape(-1)


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == np.float32 and want.dtype == np.float32, what
    assert got.shape == want.shape, f"{what}: {got.shape} values, want {want.shape}"
    a, b = got.view(np.uint32), want.view(np.uint32)
    same = (a == b) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        bad = np.flatnonzero(~same)
        i = bad[:5]
        pytest.fail(f"{what}: {bad.size} of {got.size} values differ; first at {i.tolist()}: "
                    f"got {[hex(x) for x in a[i]]} want {[hex(x) for x in b[i]]}")


def run_raw(qtype: int, n: int, raw: bytes) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool_path()), "raw", str(int(qtype)), str(n)], input=raw,
                          capture_output=True, timeout=120)


def random_blocks(qtype: QT, rng: np.random.Generator) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    if block == 1:  # plain types: every bf16/f16 pattern, random f32 bits plus the specials
        if qtype in (QT.F16, QT.BF16):
            vals = np.concatenate([np.arange(65536, dtype=np.uint16),
                                   rng.integers(0, 65536, 4096, dtype=np.uint16)])
        else:
            vals = np.concatenate([np.array(F32_SPECIAL, dtype=np.uint32),
                                   rng.integers(0, 2**32, 8192, dtype=np.uint32),
                                   rng.standard_normal(4096).astype(np.float32).view(np.uint32)])
        return vals.view(np.uint8).copy()
    n_blocks = 600
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    if qtype == QT.Q8_K:
        d = np.concatenate([np.array(F32_SPECIAL, dtype=np.uint32).view(np.float32),
                            rng.standard_normal(n_blocks - len(F32_SPECIAL)).astype(np.float32)])
        blocks[:, :4] = d.view(np.uint8).reshape(n_blocks, 4)
        return blocks.reshape(-1)
    fields = F16_FIELDS[qtype]
    ns = len(F16_SPECIAL)
    for k, off in enumerate(fields):
        # blocks [0, ns*ns): every pair of specials (or every special for one field);
        # then ordinary scales of several magnitudes; the rest keep random bits.
        specials = np.array(F16_SPECIAL, dtype=np.uint16)
        combo = specials[(np.arange(ns * ns) // ns) if k == 0 else (np.arange(ns * ns) % ns)]
        normal = (rng.standard_normal(200) * 10.0 ** rng.integers(-6, 3, 200)).astype(np.float16)
        vals = np.concatenate([combo, normal.view(np.uint16)])
        blocks[:vals.size, off:off + 2] = vals.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def test_dtype_table_matches_gguf():
    out = subprocess.run([str(tool_path()), "sizes"], capture_output=True, text=True, check=True)
    ours = {}
    for line in out.stdout.splitlines():
        tid, name, be, bb, dq = line.split()
        ours[int(tid)] = (name, int(be), int(bb), dq == "1")
    for qt, (be, bb) in GGML_QUANT_SIZES.items():
        if qt == QT.Q8_1:
            # gguf-py still lists the old {f32 d, f32 s} layout (40 bytes); ggml's block_q8_1 has
            # been {f16 d, f16 s, i8 qs[32]} = 36 bytes for a long time, and so is our table.
            assert ours[int(qt)][1:3] == (32, 36)
            continue
        if int(qt) not in ours:
            continue  # a type newer than our table (e.g. NVFP4): files with it are refused
        assert ours[int(qt)][0] == qt.name, f"type id {int(qt)}"
        assert ours[int(qt)][1:3] == (be, bb), f"{qt.name}: ours {ours[int(qt)][1:3]}, gguf {(be, bb)}"
    assert {tid for tid, v in ours.items() if v[3]} == {int(q) for q in SUPPORTED}


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda q: q.name)
def test_random_blocks(qtype):
    rng = np.random.default_rng(1234 + int(qtype))
    raw = random_blocks(qtype, rng)
    block, size = GGML_QUANT_SIZES[qtype]
    n = raw.size // size * block
    res = run_raw(qtype, n, raw.tobytes())
    assert res.returncode == 0, res.stderr.decode()
    got = np.frombuffer(res.stdout, dtype=np.float32)
    assert_same(got, reference(raw, qtype), f"{qtype.name} random blocks")


def test_refusals():
    res = run_raw(QT.Q4_K, 255, b"")
    assert res.returncode == 1 and b"not a multiple of the block size 256" in res.stderr
    for qt in (QT.Q8_1, QT.IQ2_XXS, QT.TQ1_0, QT.I32):
        res = run_raw(qt, 256, bytes(GGML_QUANT_SIZES[qt][1] * (256 // GGML_QUANT_SIZES[qt][0])))
        assert res.returncode == 1 and b"no reference dequantization for " + qt.name.encode() in res.stderr
    res = run_raw(4, 32, b"")  # a retired id
    assert res.returncode == 1 and b"unknown tensor type id 4" in res.stderr


def read_exact(stream, n: int) -> bytes:
    data = stream.read(n)
    if data is None or len(data) != n:
        raise AssertionError(f"dequant_tool stream ended early ({0 if data is None else len(data)} of {n} bytes)")
    return data


@pytest.mark.parametrize("model", MODELS)
def test_model_tensors(model):
    models = os.environ.get("DSP_MODELS")
    path = Path(models) / model if models else None
    if path is None or not path.exists():
        pytest.skip(f"model {model} is absent (set DSP_MODELS, run scripts/fetch-models)")
    reader = GGUFReader(path)
    proc = subprocess.Popen([str(tool_path()), "gguf", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, bufsize=1 << 22)
    seen = {}
    try:
        for t in reader.tensors:
            (name_len,) = struct.unpack("<I", read_exact(proc.stdout, 4))
            name = read_exact(proc.stdout, name_len).decode()
            ttype, n_elems, status = struct.unpack("<IQI", read_exact(proc.stdout, 16))
            assert (name, ttype, n_elems) == (t.name, int(t.tensor_type), int(t.n_elements))
            assert status == 0, f"{name}: type {t.tensor_type.name} not dequantized"
            qtype = QT(ttype)
            block, size = GGML_QUANT_SIZES[qtype]
            raw = np.asarray(t.data).reshape(-1).view(np.uint8)
            assert raw.size == n_elems // block * size
            step = CHUNK_ELEMS // block * size
            for b0 in range(0, raw.size, step):
                want = reference(raw[b0:b0 + step], qtype)
                got = np.frombuffer(read_exact(proc.stdout, want.size * 4), dtype=np.float32)
                assert_same(got, want, f"{model}: {name} ({qtype.name}) elements from {b0 // size * block}")
            seen[qtype.name] = seen.get(qtype.name, 0) + 1
        assert proc.stdout.read(1) == b"", "dequant_tool wrote more tensors than gguf-py sees"
    finally:
        proc.stdout.close()
        err = proc.stderr.read().decode()
        rc = proc.wait()
    assert rc == 0, err
    print(f"{model}: {sum(seen.values())} tensors bit-exact, by type {seen}")


# ---- quantization -------------------------------------------------------------------------------

def quantize(qtype: QT, x: np.ndarray) -> bytes:
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    r = subprocess.run([str(tool_path()), "quantize", str(int(qtype)), str(x.size)], input=x.tobytes(), capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0])
def test_quantize_matches_gguf(qtype):
    """Q8_0 and Q4_0: byte for byte the gguf package's quantizer (ties, zeros, bf16 values, extremes)."""
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.normal(0, 0.05, 32 * 200), rng.uniform(-3, 3, 32 * 50), np.zeros(64), np.full(32, 7.0),
                        (np.arange(32 * 8) % 17 - 8) * 0.5, rng.normal(0, 1e4, 32 * 4),
                        # exact ties: amax 127 (Q8_0 scale 1) / -8 (Q4_0 scale 1), then halves
                        np.r_[127.0, np.arange(31) - 15.5], np.r_[-8.0, np.arange(31) / 4 - 3.75],
                        # subnormal maxima (infinite 1/d), infinities, NaN (first or later)
                        np.full(32, 1e-40), np.r_[-1e-40, np.full(31, 1e-41)], np.r_[1e-40, -np.full(31, 1e-41)],
                        [np.inf] + [1.0] * 31, [-2.0, np.inf] + [-1.0] * 30, [np.nan] + [1.0] * 31, [1.0, 2.0, np.nan] + [-3.0] * 29
                        ]).astype(np.float32)
    want = gguf_quantize(x, qtype)
    assert quantize(qtype, x) == want


def gguf_quantize(x: np.ndarray, qtype: QT) -> bytes:
    from gguf.quants import quantize as gq
    return gq(x.reshape(1, -1), qtype).tobytes()


def test_quantize_q4_k_matches_llama_cpp():
    """Q4_K: the gguf package has none; the fixture is llama.cpp's own quantize_row_q4_K_ref
    (tools/gen_q4k_fixture.py compiles it from the llama-cpp-python sdist), byte for byte."""
    import hashlib
    import json
    import sys
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tools"))
    import gen_q4k_fixture as gen
    fx = json.loads((root / "tests" / "fixtures" / "quant" / "q4_k-llamacpp.json").read_text())
    x = gen.q4k_inputs()
    assert hashlib.sha256(x.tobytes()).hexdigest() == fx["inputs_sha256"], "q4k_inputs() changed: rerun the generator"
    got = quantize(QT.Q4_K, x)
    bad = [i for i in range(len(x)) if got[144 * i:144 * (i + 1)].hex() != fx["blocks_hex"][i]]
    assert not bad, f"{len(bad)} of {len(x)} blocks differ from llama.cpp's, first {bad[:5]}"
