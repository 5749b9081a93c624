#!/usr/bin/env python3
"""parity_model.py -- tokenmill's forward pass against HF transformers loading the same GGUF (dequantized, fp32).

Checks (issue: foundation): first-step logits cosine >= 0.999 and same top-1 on every prompt; greedy
64-token continuations identical for >= 90% of prompts, and wherever one differs the reference's top-2
logit gap at the first differing step is < 0.1 (a near-tie). Writes a golden file that `make test`
checks without torch: tests/data/parity/<name>.json.

usage: parity_model.py --model FILE.gguf --tokenmill build/tokenmill [--golden OUT.json] [-n 64]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "Explain why the sky is blue in one sentence.",
    "1, 2, 3, 5, 8, 13,",
    "The quick brown fox",
    "In 1969, Neil Armstrong",
    "Translate to French: I love reading books.",
    "import numpy as np\nx = np.arange(10)\nprint(",
    "A recipe for pancakes:\n1.",
    "The three primary colors are",
    "Q: What is 12 times 12?\nA:",
    "Water boils at",
    "Here is a short poem about autumn:\n",
    "The most important thing about machine learning is",
    "SELECT name, age FROM users WHERE",
    "My favourite food is pizza because",
    "The theory of relativity states that",
    "List three mammals: dog,",
    "Tokyo, Paris, London and",
    "Hello! How are you today?",
    "The mitochondria is the",
    "<|im_start|>user\nWhat is the largest planet?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nGive me a fun fact about octopuses.<|im_end|>\n<|im_start|>assistant\n",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenmill", required=True)
    ap.add_argument("--golden")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    d, f = os.path.split(os.path.abspath(args.model))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None  # never stop early: compare all n tokens, like --ignore-eos

    prompts = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    with tempfile.TemporaryDirectory() as tmp:
        ids_file = os.path.join(tmp, "ids.txt")
        with open(ids_file, "w") as fh:
            for p in prompts:
                fh.write(" ".join(map(str, p)) + "\n")
        out = subprocess.run([args.tokenmill, "eval", "-m", args.model, "--ids-file", ids_file, "--out", tmp,
                              "-n", str(args.n), "-t", str(args.threads)], check=True, capture_output=True, text=True)
        tm_greedy = [json.loads(l)["tokens"] for l in out.stdout.splitlines()]
        tm_logits = [np.fromfile(os.path.join(tmp, f"logits_{i}.f32"), dtype=np.float32) for i in range(len(prompts))]

    results, golden = [], []
    n_same, ok = 0, True
    for i, p in enumerate(prompts):
        with torch.no_grad():
            ref = model(torch.tensor([p])).logits[0, -1].double().numpy()
            gen = model.generate(torch.tensor([p]), max_new_tokens=args.n, do_sample=False, pad_token_id=0,
                                 output_logits=True,
                                 return_dict_in_generate=True)
        ref_greedy = gen.sequences[0, len(p):].tolist()
        gaps = []
        for lg in gen.logits:
            t2 = torch.topk(lg[0].double(), 2).values
            gaps.append(round(float(t2[0] - t2[1]), 5))
        ours = tm_logits[i].astype(np.float64)
        cos = float(ours @ ref / (np.linalg.norm(ours) * np.linalg.norm(ref)))
        top_same = int(ours.argmax()) == int(ref.argmax())
        same = tm_greedy[i] == ref_greedy
        gap = None
        if not same:
            k = next(j for j in range(min(len(ref_greedy), len(tm_greedy[i]))) if ref_greedy[j] != tm_greedy[i][j])
            gap = gaps[k]
        n_same += same
        good = cos >= 0.999 and top_same and (same or gap < 0.1)
        ok &= good
        results.append(dict(index=i, cos=cos, top1_same=top_same, greedy_same=same, first_diff_gap=gap))
        print(f"[{i:2d}] cos={cos:.6f} top1={'ok' if top_same else 'DIFF'} greedy={'same' if same else f'diff (gap {gap:.4f})'}"
              f"{'' if good else '  <-- FAIL'}")
        top = np.argsort(-ref)[:64]
        golden.append(dict(prompt_ids=p, greedy=ref_greedy, greedy_gaps=gaps, top_ids=top.tolist(),
                           top_logits=[round(float(ref[j]), 5) for j in top]))
    frac = n_same / len(prompts)
    print(f"greedy identical: {n_same}/{len(prompts)} = {frac:.1%}")
    ok &= frac >= 0.9
    if args.golden:
        with open(args.golden, "w") as fh:
            json.dump(dict(model=os.path.basename(args.model), n=args.n, reference="transformers " +
                           __import__("transformers").__version__ + " fp32", prompts=golden), fh)
            fh.write("\n")
        print(f"wrote {args.golden}")
    print("PARITY", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
