#!/usr/bin/env python3
"""PyTorch's prefill time on bench_cuda's shapes: the anchor of issue 31.

  python3 tools/gpu/torch_anchor.py [--shape llama-3.2-1b] [--prefill 512,2048,8192]
                                    [--sample-batches 1,32,256] [--prompt-logprobs 20]

Builds transformers' LlamaForCausalLM with random bf16 weights on the GPU
(attention through torch's scaled_dot_product_attention, "sdpa"), runs one
sequence of N tokens without a KV cache and takes the logits of the last
row only, as bench_cuda's prefill does, and prints the time and TFLOPS with
bench_cuda's FLOP count, so the two lines compare directly. Exits 0 with a
note when torch, transformers or a GPU is missing (the anchor is skipped,
not failed).

--sample-batches also times top-p sampling as vLLM's sampler does it in
PyTorch (apply_top_k_top_p: sort the logits, softmax, cumulative sum, mask
the tail, then draw), temperature 0.6 and top_p 0.9 over [B, vocab] fp32
logits: the anchor for `bench_cuda --sampling top-p`, whose step time less
the greedy step's is our sampler's cost.

--prompt-logprobs N times each prefill again with every row's logits and
vLLM's prompt logprobs over them (log_softmax in fp32, the target token's
logprob gathered, topk N): the anchor for `bench_cuda --prompt-logprobs N`.
"""
import argparse
import sys
import time

SHAPES = {
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         rope_theta=500000.0, head_dim=64),
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                           num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                           rope_theta=10000.0, head_dim=64),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         rope_theta=1000000.0, head_dim=128),
    # bench_cuda's gemma-2-2b: transformers' own Gemma 2 (its norms, its
    # final softcap), with the attention through the implementation named
    # in the output line (SDPA takes no softcap: transformers passes it only
    # to the eager and flash paths).
    "gemma-2-2b": dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                       num_attention_heads=8, num_key_value_heads=4, vocab_size=256000,
                       rope_theta=10000.0, head_dim=256, family="gemma2"),
}


def matmul_params(s):
    dim, hidden, layers = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    q = s["num_attention_heads"] * s["head_dim"]
    kv = s["num_key_value_heads"] * s["head_dim"]
    return layers * (dim * (q + 2 * kv) + q * dim + 3 * dim * hidden) + s["vocab_size"] * dim


def timed(torch, fn, reps):
    """Seconds per call of fn on the GPU: one warm-up call, then reps timed."""
    with torch.inference_mode():
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--prefill", default="512,2048,8192")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--sample-batches", default="")
    ap.add_argument("--prompt-logprobs", type=int, default=-1)
    args = ap.parse_args()
    try:
        import torch
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"torch_anchor: skipped, {e}")
        return 0
    if not torch.cuda.is_available():
        print("torch_anchor: skipped, no CUDA device")
        return 0
    s = dict(SHAPES[args.shape])
    family = s.pop("family", "llama")
    if family == "gemma2":
        from transformers import Gemma2Config, Gemma2ForCausalLM
        config = Gemma2Config(max_position_embeddings=16384, sliding_window=4096,
                              attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                              query_pre_attn_scalar=256, **s)
        model_class = Gemma2ForCausalLM
    else:
        config = LlamaConfig(max_position_embeddings=16384, tie_word_embeddings=False, **s)
        model_class = LlamaForCausalLM
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_class(config).to(torch.bfloat16).eval()
    print(f"anchor: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name()}, {args.shape} bf16, attention "
          f"{model.config._attn_implementation}")
    p = matmul_params(s)
    dim, layers, vocab = s["hidden_size"], s["num_hidden_layers"], s["vocab_size"]
    q_dim = s["num_attention_heads"] * s["head_dim"]
    for n in [int(x) for x in args.prefill.split(",") if x]:
        ids = torch.randint(1, vocab, (1, n), device="cuda")

        def run():
            h = model.model(input_ids=ids, use_cache=False).last_hidden_state
            return model.lm_head(h[:, -1])

        secs = timed(torch, run, 3 if n >= 4096 else 5)
        # bench_cuda's count: the classifier on the last row only.
        flops = 2.0 * n * p - 2.0 * n * vocab * dim + 2.0 * vocab * dim + 2.0 * n * n * q_dim * layers
        tflops = flops / secs / 1e12
        print(f"anchor prefill {n:5d} tokens: {secs * 1e3:.2f} ms, {n / secs:.1f} tok/s, "
              f"{tflops:.1f} TFLOPS = {100 * tflops / args.peak_tflops:.0f}% of "
              f"{args.peak_tflops:.0f} peak")
    for n in [int(x) for x in args.prefill.split(",") if x] if args.prompt_logprobs >= 0 else []:
        ids = torch.randint(1, vocab, (1, n), device="cuda")

        def scored():
            h = model.model(input_ids=ids, use_cache=False).last_hidden_state
            logprobs = model.lm_head(h[0]).float().log_softmax(dim=-1)
            token = logprobs[:-1].gather(-1, ids[0, 1:, None])
            top = logprobs[:-1].topk(args.prompt_logprobs, dim=-1) if args.prompt_logprobs else None
            return token, top

        secs = timed(torch, scored, 3 if n >= 4096 else 5)
        print(f"anchor prefill {n:5d} tokens with prompt logprobs {args.prompt_logprobs}: "
              f"{secs * 1e3:.2f} ms")
    for b in [int(x) for x in args.sample_batches.split(",") if x]:
        logits = torch.randn(b, vocab, device="cuda", dtype=torch.float32) * 4

        def sample():
            x = logits / 0.6
            x_sort, x_idx = x.sort(dim=-1, descending=False)
            probs_sum = x_sort.softmax(dim=-1).cumsum(dim=-1)
            mask = probs_sum <= 1 - 0.9
            mask[:, -1] = False
            x_sort.masked_fill_(mask, -float("inf"))
            x = x.scatter(dim=-1, index=x_idx, src=x_sort)
            return torch.multinomial(x.softmax(dim=-1), 1)

        secs = timed(torch, sample, 20)
        print(f"anchor top-p sampling, batch {b:3d}, vocab {vocab}: {secs * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
