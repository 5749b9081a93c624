#!/usr/bin/env python3
"""bench_cpu_peer.py -- tokenmill vs llama.cpp (llama-cpp-python) on the same GGUF and threads, side by side.

pp: one forward pass over an I-token prompt (random ids, same for both); tg: O single-token decode steps.
The engines alternate, repetition by repetition, so both see the same machine state. Prints JSON lines
and a table with the ratio tokenmill / llama.cpp, and the bandwidth floor of decode when --bw is given.

usage: bench_cpu_peer.py --model M.gguf [--tokenmill build/tokenmill] [-t 2] [-p 512] [-n 128] [-r 3] [--bw GB/s]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import time


def llamacpp_run(llm, ids, n_gen):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    pp = len(ids) / (time.perf_counter() - t0)
    llm.reset()
    llm.eval(ids[:1])
    t0 = time.perf_counter()
    for i in range(n_gen):
        llm.eval([ids[1 + i % (len(ids) - 1)]])
    tg = n_gen / (time.perf_counter() - t0)
    return pp, tg


def tokenmill_run(binary, model, threads, p, n):
    out = subprocess.run([binary, "bench", "latency", "-m", model, "-t", str(threads), "--input-len", str(p),
                          "--output-len", str(n), "-r", "1", "--json"], check=True, capture_output=True, text=True)
    j = json.loads(out.stdout)
    return j["pp_tok_s"], j["tg_tok_s"], j["weight_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenmill", default="build/tokenmill")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--bw", type=float, help="measured DRAM read bandwidth, GB/s, for the decode floor")
    args = ap.parse_args()

    from llama_cpp import Llama
    import llama_cpp
    llm = Llama(model_path=args.model, n_ctx=max(args.p, args.n) + 16, n_batch=args.p, n_ubatch=args.p,
                n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    rng = random.Random(1)
    ids = [rng.randrange(1000, llm.n_vocab()) for _ in range(args.p)]
    llamacpp_run(llm, ids[:16], 4)  # warm-up
    tm = {"pp": [], "tg": []}
    lc = {"pp": [], "tg": []}
    wbytes = 0
    for _ in range(args.r):
        pp, tg, wbytes = tokenmill_run(args.tokenmill, args.model, args.threads, args.p, args.n)
        tm["pp"].append(pp)
        tm["tg"].append(tg)
        pp, tg = llamacpp_run(llm, ids, args.n)
        lc["pp"].append(pp)
        lc["tg"].append(tg)
    res = {"model": os.path.basename(args.model), "threads": args.threads, "p": args.p, "n": args.n, "reps": args.r,
           "llama_cpp_python": llama_cpp.__version__, "weight_bytes": wbytes}
    for k in ("pp", "tg"):
        res[f"tokenmill_{k}_tok_s"] = statistics.median(tm[k])
        res[f"llamacpp_{k}_tok_s"] = statistics.median(lc[k])
        res[f"ratio_{k}"] = res[f"tokenmill_{k}_tok_s"] / res[f"llamacpp_{k}_tok_s"]
    if args.bw:
        res["decode_floor_tok_s"] = args.bw * 1e9 / wbytes
    print(json.dumps(res))
    print(f"{'':6} {'tokenmill':>12} {'llama.cpp':>12} {'ratio':>7}")
    for k in ("pp", "tg"):
        print(f"{k}{args.p if k == 'pp' else args.n:<4} {res[f'tokenmill_{k}_tok_s']:12.1f} {res[f'llamacpp_{k}_tok_s']:12.1f} "
              f"{res[f'ratio_{k}']:7.2f}")
    if args.bw:
        print(f"decode floor (weights {wbytes / 1e6:.1f} MB / {args.bw:.1f} GB/s): {res['decode_floor_tok_s']:.1f} tok/s")


if __name__ == "__main__":
    main()
