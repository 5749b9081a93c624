#!/usr/bin/env python3
"""Summarize a `tokenmill bench throughput --step-trace FILE` trace: where the run's wall time went.

Each line is one tm_engine_step call: t_s dt_s kind n_seqs n_tokens n_prefill running waiting (kinds in
src/engine/tm_engine.h). A call's dt is charged to a step: its own for 's' and 'l' (an 'l' call schedules and
launches its step, and a launch may block until the device has room), the one launched by an earlier call for 'c'
and 'w' (they wait for it and collect it). Steps are classed decode (no prompt tokens), prefill (only prompt
tokens) or mixed; calls with nothing to charge ('-') are counted as idle.

usage: step_trace.py TRACE [--json | --row | --row-file F]   (--row: one line, decode-only steps | steps with prompt
tokens; --row-file F: that line written to F, then the summary printed, so a caller reads the trace once)"""
import json
import sys


def cls(n_tokens, n_prefill):
    if n_prefill == 0:
        return "decode"
    return "prefill" if n_prefill == n_tokens else "mixed"


def bucket(n_seqs):
    """the decode batch-size bucket of a step: the next multiple of 64"""
    return 64 * ((n_seqs + 63) // 64)


def summarize(lines):
    total, idle, pending = 0.0, 0.0, None
    by = {}  # class -> [steps, seconds, tokens]
    dec = {}  # decode batch bucket -> [steps, seconds]
    calls = {}
    for ln in lines:
        if not ln.strip() or ln.startswith("#"):
            continue
        f = ln.split()
        dt, kind = float(f[1]), f[2]
        n_seqs, n_tok, n_pf = int(f[3]), int(f[4]), int(f[5])
        total += dt
        calls[kind] = calls.get(kind, 0) + 1
        this = (cls(n_tok, n_pf), n_seqs, n_tok)
        if kind in ("s", "l", "c"):  # a step launched by this call: counted once, here
            e = by.setdefault(this[0], [0, 0.0, 0])
            e[0] += 1
            e[2] += n_tok
            if this[0] == "decode":
                dec.setdefault(bucket(n_seqs), [0, 0.0])[0] += 1
        if kind in ("s", "l"):
            charged, pending = this, (this if kind == "l" else None)
        elif kind == "c":
            charged, pending = pending, this
        elif kind == "w":
            charged, pending = pending, None
        else:
            charged = None
        if charged is None:
            idle += dt
            continue
        c, n, tok = charged
        by.setdefault(c, [0, 0.0, 0])[1] += dt
        if c == "decode":
            dec.setdefault(bucket(n), [0, 0.0])[1] += dt
    return {"wall_s": total, "idle_s": idle, "calls": calls,
            "classes": {k: {"steps": v[0], "s": v[1], "tokens": v[2], "ms_per_step": 1e3 * v[1] / max(v[0], 1)}
                        for k, v in by.items()},
            "decode_by_batch": {str(k): {"steps": v[0], "s": v[1], "ms_per_step": 1e3 * v[1] / max(v[0], 1)}
                                for k, v in sorted(dec.items())}}


def row(r):
    """One line: the decode-only steps against the steps with prompt tokens (scripts/gpu.sh's table)."""
    d = r["classes"].get("decode", {"steps": 0, "s": 0.0, "ms_per_step": 0.0})
    p = [v for k, v in r["classes"].items() if k != "decode"]
    ps, pn = sum(v["s"] for v in p), sum(v["steps"] for v in p)
    return (f'{d["steps"]} steps {d["s"]:.1f} s ({d["ms_per_step"]:.2f} ms each) | {pn} steps {ps:.1f} s, '
            f'of {r["wall_s"]:.1f} s')


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as fh:
        r = summarize(fh)
    if "--json" in sys.argv:
        print(json.dumps(r, indent=1))
        return
    if "--row" in sys.argv:
        print(row(r))
        return
    if "--row-file" in sys.argv:
        i = sys.argv.index("--row-file")
        if i + 1 >= len(sys.argv):
            sys.exit("step_trace.py: --row-file needs a file name")
        with open(sys.argv[i + 1], "w") as fh:
            fh.write(row(r) + "\n")
    print(f"wall {r['wall_s']:.3f} s in {sum(r['calls'].values())} calls {r['calls']}; idle {r['idle_s']:.3f} s")
    for k, v in sorted(r["classes"].items()):
        print(f"  {k:8s} {v['steps']:6d} steps {v['s']:8.3f} s {v['tokens']:9d} tokens {v['ms_per_step']:8.3f} ms/step")
    for k, v in r["decode_by_batch"].items():
        print(f"  decode batch <= {k:>5s}: {v['steps']:6d} steps {v['s']:8.3f} s {v['ms_per_step']:8.3f} ms/step")


if __name__ == "__main__":
    main()
