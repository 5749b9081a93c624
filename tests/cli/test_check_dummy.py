"""tests/gpu/check_dummy.py (the GPU-vs-CPU logits check of scripts/gpu.sh) on a machine without a GPU: a wrapper
binary runs its "cuda" side on the CPU backend, so the plumbing (two evals, the logit files, the comparison, the
summary and exit code) is checked here; the tolerance itself is exercised by a GPU side that really differs
(int8 activations)."""
import os
import stat
import subprocess
import sys

from conftest import ROOT, TOKENMILL

SCRIPT = os.path.join(ROOT, "tests", "gpu", "check_dummy.py")


def wrapper(tmp_path):
    w = tmp_path / "tm_cpu_as_cuda.sh"
    w.write_text('#!/bin/sh\nargs=""\nfor a in "$@"; do [ "$a" = cuda ] && a=cpu; args="$args $a"; done\n'
                 f'exec {TOKENMILL} $args\n')
    w.chmod(w.stat().st_mode | stat.S_IXUSR)
    return str(w)


def run(tmp_path, *extra):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, SCRIPT, "--tokenmill", wrapper(tmp_path), "--model",
                        "dummy:smollm2-135m:q8_0", "--out", str(out), "-n", "2", *extra],
                       capture_output=True, text=True, timeout=300)
    return r, (out / "summary.txt").read_text()


def test_same_backend_passes(tmp_path):
    r, summary = run(tmp_path, "--layers", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert summary.startswith("ok:") and "rel L2 <= 0.00e+00" in summary and "identical 5/5" in summary


def test_a_real_difference_fails(tmp_path):
    # int8 activations on the "GPU" side: ~1e-2 relative L2, over one layer's allowance (2.5e-3) but within 30's
    r, summary = run(tmp_path, "--layers", "1", "--gpu-arg=--act-bits", "--gpu-arg=8")
    assert r.returncode == 1 and summary.splitlines()[-1].startswith("FAIL:"), r.stdout
    r, summary = run(tmp_path, "--layers", "30", "--gpu-arg=--act-bits", "--gpu-arg=8")
    assert r.returncode == 0 and summary.startswith("ok:"), r.stdout
