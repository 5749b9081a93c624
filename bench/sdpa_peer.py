#!/usr/bin/env python3
"""sdpa_peer.py -- PyTorch scaled_dot_product_attention on the issue's attention shapes, the peer that the CUDA
backend's attention targets are set against (its cuDNN and FlashAttention-2 backends), timed on the
same machine as tb_attn_prefill / tb_attn_decode so the ratio is side by side.

Shapes (Llama-3-8B geometry: 32 query heads, 8 kv heads, head_dim 128, bf16):
  prefill  causal, 4096 tokens, batch 1 and 4: FLOPs = 4 * B * 32 * 128 * 4096^2 / 2 (the causal half, as the
           test bed counts them); TFLOP/s.
  decode   one query token a sequence, 64 sequences x 4096 cached tokens in a contiguous cache: bytes = the K and V
           read (64 * 8 * 4096 * 128 * 2 * 2); GB/s.
GQA through enable_gqa (k and v keep 8 heads); a backend that refuses a shape prints 'unsupported'. Times: CUDA
events around each call, median of 20 after 3 warm-ups. Prints one 'PEER' line per (backend, shape).
Needs torch with CUDA (the GPU machine has it); run by scripts/gpu.sh's kernels stage when torch imports."""
import sys
import warnings


def main():
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F
    except Exception as e:  # no torch: nothing to compare against
        print(f"# sdpa_peer: torch unavailable ({e})")
        return 0
    if not torch.cuda.is_available():
        print("# sdpa_peer: no CUDA device")
        return 0
    dev = torch.device("cuda")
    torch.manual_seed(0)
    H, KV, D = 32, 8, 128
    # the memory-efficient backend takes no GQA (enable_gqa) and is not a peer the issue names
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash2", SDPBackend.FLASH_ATTENTION)]
    warnings.filterwarnings("ignore", category=UserWarning)  # the backends' notes on why one refuses a shape

    def timed(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        ts.sort()
        return ts[len(ts) // 2]

    print(f"# sdpa_peer: torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    cases = []
    for B in (1, 4):
        S = 4096
        q = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, KV, S, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, KV, S, D, device=dev, dtype=torch.bfloat16)
        flops = 4.0 * B * H * D * S * S / 2
        cases.append((f"prefill_b{B}_4096_causal", q, k, v, True, flops, 0.0))
    NS, L = 64, 4096
    q = torch.randn(NS, H, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(NS, KV, L, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(NS, KV, L, D, device=dev, dtype=torch.bfloat16)
    cases.append(("decode_64x4096", q, k, v, False, 0.0, 2.0 * NS * KV * L * D * 2))
    for name, be in backends:
        for cname, q, k, v, causal, flops, nbytes in cases:
            def run():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            try:
                with sdpa_kernel([be]):
                    us = timed(run)
            except Exception as e:
                print(f"PEER sdpa {name:9s} {cname:24s} unsupported ({str(e).splitlines()[0][:80]})")
                continue
            rate = f"TFLOP/s={flops / (us * 1e6):.1f}" if flops else f"GB/s={nbytes / (us * 1e3):.1f}"
            print(f"PEER sdpa {name:9s} {cname:24s} us={us:.1f} {rate}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
