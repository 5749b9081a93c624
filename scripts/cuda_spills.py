#!/usr/bin/env python3
"""cuda_spills.py -- list the CUDA kernels that ptxas compiles with spills or a stack frame.

A spill in a bandwidth-bound kernel costs more than its bytes: removing a 4-byte spill from the batch-1 gate/up
GEMV made 8B batch-1 decode 1.2% faster (docs/PERFORMANCE.md, twenty-third session). This recompiles every .cu of
the CUDA backend with `-Xptxas -v` from build-gpu's compile commands (configure build-gpu first, e.g. with
scripts/gpu_pack.sh) and prints one line per kernel with a stack frame or spills: frame, spill stores, spill loads
(bytes), registers, and the demangled name when c++filt is present.

    python3 scripts/cuda_spills.py [--build build-gpu] [FILTER]    FILTER: a substring of the source file name
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile


def ptxas_entries(log):
    """{mangled kernel name: [stack frame, spill stores, spill loads(, registers)]} from `ptxas -v` output (bytes)"""
    name, info = None, {}
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            info[name] = [int(v) for v in m.groups()]
        m = re.search(r"Used (\d+) registers", line)
        if m and name in info:
            info[name].append(int(m.group(1)))
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("filter", nargs="?", default="")
    a = ap.parse_args()
    db = os.path.join(a.build, "compile_commands.json")
    if not os.path.exists(db):
        sys.exit(f"cuda_spills: no {db} (configure the CUDA build first)")
    cmds = [e for e in json.load(open(db)) if e["file"].endswith(".cu") and a.filter in os.path.basename(e["file"])]
    if not cmds:
        sys.exit("cuda_spills: no CUDA source matches")
    cxxfilt = shutil.which("c++filt")
    found = 0
    with tempfile.TemporaryDirectory() as tmp:
        for e in cmds:
            argv = shlex.split(e["command"])
            if "-o" in argv:  # compile to a scratch object, leave the build's own untouched
                argv[argv.index("-o") + 1] = os.path.join(tmp, "x.o")
            r = subprocess.run(argv + ["-Xptxas", "-v"], cwd=e["directory"], capture_output=True, text=True)
            if r.returncode != 0:
                print(r.stderr[-2000:], file=sys.stderr)
                sys.exit(f"cuda_spills: compiling {e['file']} failed")
            info = ptxas_entries(r.stderr)
            for k, v in info.items():
                if any(v[:3]):
                    found += 1
                    pretty = k
                    if cxxfilt:
                        pretty = subprocess.run([cxxfilt, k], capture_output=True, text=True).stdout.strip()
                    regs = v[3] if len(v) > 3 else "?"
                    src = os.path.basename(e["file"])
                    print(f"{src}: frame {v[0]} spill st {v[1]} ld {v[2]} regs {regs}  {pretty}")
    print(f"# {found} kernel(s) with a stack frame or spills in {len(cmds)} file(s)")


if __name__ == "__main__":
    main()
