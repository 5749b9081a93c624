"""GPU parity: SmolLM2 Q4_1 on `--device cuda` against the goldens that the CPU backend matches exactly
(tests/data/parity, HF transformers fp32). Run by scripts/gpu.sh on a GPU machine.

The GPU runs bf16 activations, so logits differ from fp32 by bf16 rounding: the check is first-step top-1 equal
unless the reference's top-2 gap is a near-tie, cosine of the reference's top-64 logits >= 0.99, and greedy
continuations identical or first differing where the reference's top-2 gap is small. Prints a summary line and
exits non-zero on failure."""
import argparse
import json
import os
import sys

import numpy as np

from tm_eval import EvalError, eval_ids, first_diff, read_logits, write_ids

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests/data/parity/smollm2-135m-instruct-q4_1.hf.json")
NEAR_TIE = 0.5  # logit gap under which bf16 rounding may legitimately flip the order


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenmill", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    g = json.load(open(GOLDEN))
    ids_file = os.path.join(a.out, "ids.txt")
    write_ids(ids_file, [p["prompt_ids"] for p in g["prompts"]])
    try:
        greedy = eval_ids(a.tokenmill, a.model, "cuda", ids_file, ["--out", a.out, "-n", str(g["n"])])
    except EvalError as e:
        print(e)
        open(os.path.join(a.out, "summary.txt"), "w").write(f"FAIL: eval exited {e.returncode}\n")
        sys.exit(1)
    fails, same, coss, tie_div = [], 0, [], 0
    for i, p in enumerate(g["prompts"]):
        logits = read_logits(a.out, i)
        ref = np.array(p["top_logits"])
        ours = logits[p["top_ids"]]
        cos = ours @ ref / (np.linalg.norm(ours) * np.linalg.norm(ref))
        coss.append(cos)
        gap0 = ref[0] - ref[1]
        if int(logits.argmax()) != p["top_ids"][0] and gap0 >= NEAR_TIE:
            fails.append(f"prompt {i}: top-1 {int(logits.argmax())} != {p['top_ids'][0]} (gap {gap0:.3f})")
        if cos < 0.99:
            fails.append(f"prompt {i}: cosine {cos:.5f}")
        if greedy[i] == p["greedy"]:
            same += 1
        else:
            k = first_diff(greedy[i], p["greedy"])
            if k >= len(p["greedy_gaps"]):  # one ended (EOS) where the other went on: no reference gap there
                fails.append(f"prompt {i}: {len(greedy[i])} tokens against the reference's {len(p['greedy'])}")
                continue
            gap = p["greedy_gaps"][k]
            if gap < NEAR_TIE:
                tie_div += 1
            else:
                fails.append(f"prompt {i}: greedy differs at step {k}, reference gap {gap:.3f}")
    n = len(g["prompts"])
    summary = (f"{'ok' if not fails else 'FAIL'}: greedy identical {same}/{n}, {tie_div} diverge after a near-tie "
               f"(gap < {NEAR_TIE}); min cosine {min(coss):.5f}")
    for f in fails:
        print(f)
    print(summary)
    open(os.path.join(a.out, "summary.txt"), "w").write("\n".join(fails + [summary]) + "\n")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
