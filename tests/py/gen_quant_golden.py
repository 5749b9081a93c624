#!/usr/bin/env python3
"""gen_quant_golden.py -- write golden files for tm_dequant_row / tm_quant_row using gguf-py as the oracle.

Usage: /work/main/.deps/venv/bin/python tests/py/gen_quant_golden.py [outdir]   (default tests/data/quant)

Each file <type>.bin is little-endian:
    char magic[4] = "TMQG"; u32 version = 1; u32 ggml_type; u32 n_elements; u32 n_bytes; u32 has_src;
    u8 raw[n_bytes];                  block bytes (gguf-py's quantization of src, or random valid blocks)
    f32 src[n_elements]               only when has_src: the input that gguf-py quantized
    f32 expect[n_elements]            gguf-py's dequantization of raw
For F32/F16/BF16/Q8_0/Q4_0/Q4_1 gguf-py quantizes src (tokenmill must produce the same bytes); gguf-py cannot
quantize Q4_K/Q6_K, so those files hold random-but-valid blocks and only the dequantization is checked.
"""
import os
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

SEED = 20261129


def src_values(rng, n, block):
    """Gaussian data with a different scale per block, plus blocks that exercise edge cases."""
    x = rng.standard_normal(n).astype(np.float32)
    nb = n // block
    scales = np.exp(rng.uniform(-6, 3, nb)).astype(np.float32)
    x = (x.reshape(nb, block) * scales[:, None]).reshape(n)
    if nb >= 4:
        x[0:block] = 0.0                                  # all-zero block
        x[block:2 * block] = np.float32(0.37)             # constant block
        x[2 * block:3 * block] = rng.integers(-4, 5, block).astype(np.float32)  # exact small integers (ties)
    return x.astype(np.float32)


def write(path, gtype, raw, src, expect):
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    expect = np.ascontiguousarray(expect, dtype=np.float32).reshape(-1)
    n = expect.size
    with open(path, "wb") as f:
        f.write(b"TMQG")
        f.write(struct.pack("<5I", 1, int(gtype), n, raw.size, 1 if src is not None else 0))
        f.write(raw.tobytes())
        if src is not None:
            f.write(np.ascontiguousarray(src, dtype="<f4").tobytes())
        f.write(expect.astype("<f4").tobytes())


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "data", "quant")
    os.makedirs(outdir, exist_ok=True)
    rng = np.random.default_rng(SEED)

    # float types: gguf-py converts; include overflow, subnormal and rounding-tie values
    edge = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 65520.0, 70000.0, -1e9, 6e-8, 3e-8, 1e-10, 5.96e-8,
                     1.00048828125, 1.000732421875, 2049.0, 2051.0, 1e30, -3.4e38], dtype=np.float32)
    for name, gtype in (("f32", T.F32), ("f16", T.F16), ("bf16", T.BF16)):
        x = np.concatenate([edge, src_values(rng, 256 - edge.size, 1)]).astype(np.float32)
        if gtype == T.BF16:
            x[5] = np.float32("nan")
            x[6] = np.float32("inf")
        with np.errstate(over="ignore"):
            raw = quants.quantize(x, gtype)
        expect = quants.dequantize(raw, gtype)
        write(os.path.join(outdir, name + ".bin"), gtype, raw, x, expect)

    # 32-element block types gguf-py can quantize
    for name, gtype in (("q8_0", T.Q8_0), ("q4_0", T.Q4_0), ("q4_1", T.Q4_1)):
        x = src_values(rng, 32 * 16, 32)
        raw = quants.quantize(x, gtype)
        expect = quants.dequantize(raw, gtype)
        write(os.path.join(outdir, name + ".bin"), gtype, raw, x, expect)

    # K-quants: random valid blocks (gguf-py only dequantizes these)
    nb = 6
    d = rng.uniform(1e-4, 0.05, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    dmin = rng.uniform(1e-4, 0.05, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    scales = rng.integers(0, 256, (nb, 12), dtype=np.uint8)
    qs = rng.integers(0, 256, (nb, 128), dtype=np.uint8)
    q4k = np.concatenate([d, dmin, scales, qs], axis=1)  # 144 bytes per block
    assert q4k.shape[1] == 144
    write(os.path.join(outdir, "q4_K.bin"), T.Q4_K, q4k, None, quants.dequantize(q4k, T.Q4_K))

    ql = rng.integers(0, 256, (nb, 128), dtype=np.uint8)
    qh = rng.integers(0, 256, (nb, 64), dtype=np.uint8)
    sc = rng.integers(-128, 128, (nb, 16)).astype(np.int8).view(np.uint8)
    d6 = rng.uniform(1e-5, 0.01, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    q6k = np.concatenate([ql, qh, sc, d6], axis=1)  # 210 bytes per block
    assert q6k.shape[1] == 210
    write(os.path.join(outdir, "q6_K.bin"), T.Q6_K, q6k, None, quants.dequantize(q6k, T.Q6_K))


if __name__ == "__main__":
    main()
