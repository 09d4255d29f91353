#!/usr/bin/env python3
"""Small random checkpoints of architectures no shared fixture has.

  python3 tests/model/hf_generated/make_fixtures.py   # rewrites tests/model/hf_generated/*/

Each NAME/ gets config.json, model.safetensors (BF16, as the real
checkpoints store them) and reference.json holding only prompts: the same
seed always writes the same bytes. tools/gpu/hf_derived_references.py runs
transformers on them where it is installed (the GPU machines) and writes
tests/model/hf_derived/NAME.reference.json with its greedy tokens, which
HfDerivedTest holds Tandem to (derived.json lists them as "generated").
Plain Python (no numpy): the files are small.
"""
import json
import math
import os
import random
import struct


def bf16_bytes(values):
    out = bytearray()
    for v in values:
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
        out += struct.pack("<H", (bits >> 16) & 0xFFFF)
    return bytes(out)


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in sorted(tensors.items()):
        data = bf16_bytes(values)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def gemma3(rng):
    """Gemma3ForCausalLM: 4 layers, sliding_window_pattern 2 (local, global,
    local, global), a window of 6, query_pre_attn_scalar 24 against head_dim
    32, linear RoPE scaling 4 on the global layers, a local base of 1e4."""
    dim, hidden, layers, heads, kv_heads, head, vocab = 64, 128, 4, 4, 2, 32, 512
    config = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": dim,
        "intermediate_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head,
        "vocab_size": vocab,
        "max_position_embeddings": 512,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": 24,
        "sliding_window": 6,
        "sliding_window_pattern": 2,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "attention_bias": False,
        # Untied, unlike the real ones: with a tied table small enough for
        # the layers to outweigh the embedding in the residual stream, the
        # logits would be too close to tell tokens apart.
        "tie_word_embeddings": False,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }

    def normal(n, std):
        return [rng.gauss(0.0, std) for _ in range(n)]

    t = {"model.embed_tokens.weight": ([vocab, dim], normal(vocab * dim, 0.05)),
         "lm_head.weight": ([vocab, dim], normal(vocab * dim, 0.3)),
         "model.norm.weight": ([dim], normal(dim, 0.1))}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = ([heads * head, dim], normal(heads * head * dim, dim ** -0.5))
        t[p + "self_attn.k_proj.weight"] = ([kv_heads * head, dim], normal(kv_heads * head * dim, dim ** -0.5))
        t[p + "self_attn.v_proj.weight"] = ([kv_heads * head, dim], normal(kv_heads * head * dim, dim ** -0.5))
        t[p + "self_attn.o_proj.weight"] = ([dim, heads * head], normal(dim * heads * head, (heads * head) ** -0.5))
        t[p + "self_attn.q_norm.weight"] = ([head], normal(head, 0.1))
        t[p + "self_attn.k_norm.weight"] = ([head], normal(head, 0.1))
        t[p + "mlp.gate_proj.weight"] = ([hidden, dim], normal(hidden * dim, dim ** -0.5))
        t[p + "mlp.up_proj.weight"] = ([hidden, dim], normal(hidden * dim, dim ** -0.5))
        t[p + "mlp.down_proj.weight"] = ([dim, hidden], normal(dim * hidden, hidden ** -0.5))
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            t[p + norm + ".weight"] = ([dim], normal(dim, 0.1))
    return config, t, vocab


def gemma2(rng):
    """Gemma2ForCausalLM: gemma3's shapes and weights less the q/k norms, its
    4 layers alternating sliding (window 6) and full, softcaps small enough
    to bite (attention 2, logits 5; the real ones are 50 and 30 on larger
    scores), untied as gemma3's, and query_pre_attn_scalar 24 against
    head_dim 32 (as Gemma 2 27B's 144 against 128)."""
    config, t, vocab = gemma3(rng)
    for key in ("sliding_window_pattern", "rope_local_base_freq", "rope_scaling"):
        del config[key]
    config.update({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
                   "query_pre_attn_scalar": 24, "rope_theta": 10000.0,
                   "attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0})
    for name in list(t):
        if "q_norm" in name or "k_norm" in name:
            del t[name]
    return config, t, vocab


def prompts(rng, vocab):
    cases = []
    for length in (1, 5, 17, 40, 100):
        ids = [2] + [rng.randrange(3, vocab) for _ in range(length - 1)]
        cases.append({"prompt_token_ids": ids, "max_tokens": 24})
    return {"made_by": "make_fixtures.py: prompts only; transformers' tokens are in "
                       "tests/model/hf_derived/", "cases": cases}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    for name, make in (("gemma3", gemma3), ("gemma2", gemma2)):
        rng = random.Random(f"tandem-{name}")
        config, tensors, vocab = make(rng)
        out = os.path.join(here, name)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
            f.write("\n")
        write_safetensors(os.path.join(out, "model.safetensors"), tensors)
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(prompts(rng, vocab), f, indent=1)
            f.write("\n")
        print(out, sum(len(v) for _, v in tensors.values()), "parameters")


if __name__ == "__main__":
    main()
