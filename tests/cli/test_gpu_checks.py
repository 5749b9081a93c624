"""The GPU script's checks (tests/gpu/check_dummy.py, check_engine.py, check_parity.py, run by scripts/gpu.sh) on a
machine without a GPU: a wrapper binary runs their "cuda" side on the CPU backend, so their plumbing (the eval runs,
the files, the comparisons, the summary and exit code) is checked here, and a "GPU" side that really differs (int8
activations) exercises what they do when outputs part."""
import os
import re
import stat
import subprocess
import sys

from conftest import MODEL, ROOT, TOKENMILL

GPU_TESTS = os.path.join(ROOT, "tests", "gpu")


def wrapper(tmp_path, int8_when=None):
    """a tokenmill that runs `--device cuda` on the CPU; with int8_when, runs given that argument use --act-bits 8"""
    w = tmp_path / "tm_cpu_as_cuda.sh"
    cond = f'[ "$a" = "{int8_when}" ] && perturb=1; ' if int8_when else ""
    w.write_text('#!/bin/sh\nargs=""; perturb=0\n'
                 f'for a in "$@"; do [ "$a" = cuda ] && a=cpu; {cond}args="$args $a"; done\n'
                 '[ $perturb = 1 ] && args="$args --act-bits 8"\n'
                 f'exec {TOKENMILL} $args\n')
    w.chmod(w.stat().st_mode | stat.S_IXUSR)
    return str(w)


def run_dummy(tmp_path, *extra):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(GPU_TESTS, "check_dummy.py"), "--tokenmill", wrapper(tmp_path),
                        "--model", "dummy:smollm2-135m:q8_0", "--out", str(out), "-n", "2", *extra],
                       capture_output=True, text=True, timeout=300)
    return r, (out / "summary.txt").read_text()


def test_dummy_same_backend_passes(tmp_path):
    r, summary = run_dummy(tmp_path, "--layers", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert summary.startswith("ok:") and "rel L2 <= 0.00e+00" in summary and "identical 5/5" in summary


def test_dummy_a_real_difference_fails(tmp_path):
    # int8 activations on the "GPU" side: ~1e-2 relative L2, over one layer's allowance (2.5e-3) but within 30's
    r, summary = run_dummy(tmp_path, "--layers", "1", "--gpu-arg=--act-bits", "--gpu-arg=8")
    assert r.returncode == 1 and summary.splitlines()[-1].startswith("FAIL:"), r.stdout
    r, summary = run_dummy(tmp_path, "--layers", "30", "--gpu-arg=--act-bits", "--gpu-arg=8")
    assert r.returncode == 0 and summary.startswith("ok:"), r.stdout


def run_engine(tmp_path, int8_when=None):
    return subprocess.run([sys.executable, os.path.join(GPU_TESTS, "check_engine.py"), "--tokenmill",
                           wrapper(tmp_path, int8_when), "--model", MODEL], capture_output=True, text=True, timeout=600)


def test_engine_identical_on_the_cpu(tmp_path):
    # the CPU backend is batch-invariant: alone and batched + chunked + preempted + prefix-shared are the same
    r = run_engine(tmp_path)
    assert r.returncode == 0 and "ok: 32/32 identical" in r.stdout, r.stdout + r.stderr


def test_engine_every_parting_gets_a_cpu_gap(tmp_path):
    # the batched run with int8 activations parts from the alone run: each parting is named with the CPU backend's
    # top-2 gap there, and the verdict follows the rule (>= 60% identical, every gap a near-tie < 0.5)
    r = run_engine(tmp_path, int8_when="--max-seqs")
    line = r.stdout.strip().splitlines()[-1]
    m = re.match(r"(ok|FAIL): (\d+)/32 identical", line)
    assert m, r.stdout + r.stderr
    same = int(m.group(2))
    gaps = [float(x) for x in re.findall(r"prompt \d+ step \d+ \(CPU gap ([0-9.]+)\)", line)]
    assert same < 32 and len(gaps) == 32 - same, line
    ok = same >= 0.6 * 32 and all(gap < 0.5 for gap in gaps)
    assert m.group(1) == ("ok" if ok else "FAIL") and r.returncode == (0 if ok else 1), line


def run_parity(tmp_path, model=MODEL, int8_when=None):
    out = tmp_path / "parity"
    r = subprocess.run([sys.executable, os.path.join(GPU_TESTS, "check_parity.py"), "--tokenmill",
                        wrapper(tmp_path, int8_when), "--model", model, "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    return r, (out / "summary.txt").read_text()


def test_parity_on_the_cpu_matches_the_goldens(tmp_path):
    # the CPU backend matches the HF fp32 goldens exactly, so the "GPU" side run on it passes with every prompt equal
    r, summary = run_parity(tmp_path)
    assert r.returncode == 0 and summary.startswith("ok: greedy identical 24/24, 0 diverge"), r.stdout + r.stderr


def test_parity_reports_a_failed_eval(tmp_path):
    # eval cannot load the model: the summary names its exit status and the check fails
    r, summary = run_parity(tmp_path, model=str(tmp_path / "missing.gguf"))
    assert r.returncode == 1 and re.match(r"FAIL: eval exited [1-9]\d*$", summary.strip()), summary


def test_parity_every_divergence_is_judged_at_the_reference_gap(tmp_path):
    # int8 activations on the "GPU" side part some continuations from the goldens: each is counted as a near-tie or
    # named as a failure at its step with the reference's gap, and the verdict follows
    r, summary = run_parity(tmp_path, int8_when="--ids-file")
    last = summary.splitlines()[-1]
    m = re.match(r"(ok|FAIL): greedy identical (\d+)/24, (\d+) diverge after a near-tie", last)
    assert m, summary + r.stdout + r.stderr
    same, ties = int(m.group(2)), int(m.group(3))
    far = re.findall(r"prompt \d+: greedy differs at step \d+, reference gap ([0-9.]+)", summary)
    assert same < 24 and same + ties + len(far) == 24, summary
    assert all(float(gap) >= 0.5 for gap in far)
    assert m.group(1) == ("FAIL" if summary.count("\n") > 1 else "ok") and r.returncode == (m.group(1) == "FAIL")
