"""`tokenmill eval` for the GPU checks (check_dummy.py, check_engine.py, check_parity.py): write prompt ids, run, read
the outputs."""
import json
import os
import subprocess

import numpy as np


def write_ids(path, seqs):
    """one line of space-separated token ids per sequence"""
    with open(path, "w") as f:
        f.write("".join(" ".join(map(str, s)) + "\n" for s in seqs))


class EvalError(RuntimeError):
    """eval exited non-zero: the message is the end of its stderr, returncode its exit status"""

    def __init__(self, returncode, stderr):
        super().__init__(stderr[-2000:])
        self.returncode = returncode


def eval_ids(tm, model, device, ids_file, extra, env=None, timeout=600):
    """the greedy continuation of each prompt line; EvalError when eval fails"""
    r = subprocess.run([tm, "eval", "-m", model, "--device", device, "--ids-file", ids_file] + extra,
                       capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise EvalError(r.returncode, r.stderr)
    return [json.loads(line)["tokens"] for line in r.stdout.splitlines() if line.startswith("{")]


def first_diff(x, y):
    """the first step at which two token lists differ (the shorter one's length when one is a prefix of the other)"""
    n = min(len(x), len(y))
    return next((j for j in range(n) if x[j] != y[j]), n)


def read_logits(out, i):
    """the first-step logits of prompt i of an `eval --out OUT` run, as float64"""
    return np.fromfile(os.path.join(out, f"logits_{i}.f32"), dtype=np.float32).astype(np.float64)
