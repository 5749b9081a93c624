"""HF transformers (eager PyTorch, bf16) on the GPU, on the shapes tokenmill's GPU benchmarks use: the side-by-side
peer of scripts/gpu.sh. Random weights (like tokenmill's dummy models), random prompt ids, greedy, EOS ignored.

  python3 bench/hf_gpu_bench.py --out hf.json [--skip-throughput]

Reports batch-1 decode tok/s for Llama-3.2-1B and Llama-3-8B shapes (128 prompt tokens, 256 new tokens; the
prefill is timed separately and subtracted), both through generate() and through a plain greedy loop over
model.forward with the KV cache (the eager model without generate()'s per-step machinery), and 8B throughput at
batch 64, 1024 prompt tokens, 1024 new tokens (output tok/s, forward loop)."""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "llama3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, head_dim=64, tie_word_embeddings=True, rope_theta=500000.0),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, tie_word_embeddings=False, rope_theta=500000.0),
}


def make(shape):
    cfg = LlamaConfig(vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5, **SHAPES[shape])
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        m = LlamaForCausalLM(cfg)
        torch.set_default_dtype(torch.float32)
    return m.eval()


def gen_time(m, ids, new):
    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                         attention_mask=torch.ones_like(ids))
    torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + new
    return time.perf_counter() - t


def loop_time(m, ids, new):
    """A plain greedy loop over model.forward with the model's KV cache (no generate() machinery)."""
    from transformers import DynamicCache
    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.no_grad():
        cache = DynamicCache()
        out = m(input_ids=ids, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        for _ in range(new - 1):
            out = m(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-throughput", action="store_true")
    a = ap.parse_args()
    res = {}
    for shape in SHAPES:
        m = make(shape)
        ids = torch.randint(0, 128256, (1, 128), device="cuda")
        gen_time(m, ids, 8)  # warm-up
        loop_time(m, ids, 8)
        t1 = gen_time(m, ids, 1)
        tn = gen_time(m, ids, 257)
        res[f"{shape}_b1_generate_tok_s"] = 256 / (tn - t1)
        t1 = loop_time(m, ids, 1)
        tn = loop_time(m, ids, 257)
        res[f"{shape}_b1_loop_tok_s"] = 256 / (tn - t1)
        print(f"{shape}: batch-1 decode: generate() {res[f'{shape}_b1_generate_tok_s']:.1f} tok/s, "
              f"forward loop {res[f'{shape}_b1_loop_tok_s']:.1f} tok/s", flush=True)
        if shape == "llama3-8b" and not a.skip_throughput:
            ids = torch.randint(0, 128256, (64, 1024), device="cuda")
            t = loop_time(m, ids, 1024)
            res["llama3-8b_b64_1024_1024_out_tok_s"] = 64 * 1024 / t
            print(f"{shape}: batch 64, 1024/1024 (forward loop): {res['llama3-8b_b64_1024_1024_out_tok_s']:.0f} output tok/s",
                  flush=True)
        del m
        torch.cuda.empty_cache()
    json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
