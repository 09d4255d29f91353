#!/usr/bin/env python3
"""Greedy tokens of a float64 Gemma 3 (or Gemma 2) forward in plain Python,
written from transformers' modeling_gemma3.py and modeling_gemma2.py (the
RMSNorm's (1 + w), Gemma 3's q/k norms before RoPE, the sandwich norms, the
local layers' window and (Gemma 3) RoPE base, the global layers' linear
scaling, query_pre_attn_scalar, Gemma 2's softcapping of attention scores
and logits), independent of Tandem's code:

  python3 tests/model/hf_generated/gemma3_float64.py tests/model/hf_generated/gemma3 OUT.json

It is ours, so it stands in for transformers only until
tools/gpu/hf_derived_references.py has run on a machine that has it
(tests/model/hf_derived/gemma3.reference.json); Gemma3Test holds Tandem to
both. About a minute for the five prompts.
"""
import json, math, struct, sys
d = sys.argv[1]
cfg = json.load(open(d + "/config.json"))
raw = open(d + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
W = {}
for name, t in hdr.items():
    a, b = t["data_offsets"]
    buf = raw[8 + n + a: 8 + n + b]
    vals = [struct.unpack("<f", struct.pack("<I", h << 16))[0] for (h,) in struct.iter_unpack("<H", buf)]
    shape = t["shape"]
    W[name] = [vals[i * shape[1]:(i + 1) * shape[1]] for i in range(shape[0])] if len(shape) == 2 else vals
dim, L, H, KV, hd = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
gemma2 = cfg["model_type"] == "gemma2"
eps = cfg["rms_norm_eps"]; pattern = cfg.get("sliding_window_pattern", 2); win = cfg["sliding_window"]
attn_cap = cfg.get("attn_logit_softcapping"); final_cap = cfg.get("final_logit_softcapping")
types = ["sliding" if (i + 1) % pattern else "full" for i in range(L)]
scaling = cfg["query_pre_attn_scalar"] ** -0.5
def inv_freq(base, factor):
    return [1.0 / (base ** (2 * i / hd)) / factor for i in range(hd // 2)]
freqs = {"sliding": inv_freq(cfg["rope_theta"] if gemma2 else cfg["rope_local_base_freq"], 1.0),
         "full": inv_freq(cfg["rope_theta"], cfg["rope_scaling"]["factor"] if cfg.get("rope_scaling") else 1.0)}
def rms(x, w):
    s = math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v / s * (1.0 + wi) for v, wi in zip(x, w)]
def mv(M, x):
    return [sum(a * b for a, b in zip(row, x)) for row in M]
def rope(v, pos, f):
    half = hd // 2
    out = list(v)
    for i in range(half):
        c, s = math.cos(pos * f[i]), math.sin(pos * f[i])
        out[i] = v[i] * c - v[i + half] * s
        out[i + half] = v[i + half] * c + v[i] * s
    return out
def gelu(x):
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
E = W["model.embed_tokens.weight"]; LM = W.get("lm_head.weight", E)
def run(prompt, steps):
    cache = [([], []) for _ in range(L)]
    toks = list(prompt); out = []; margins = []
    pos = 0
    pending = list(prompt)
    while True:
        for t in pending:
            x = [v * math.sqrt(dim) for v in E[t]]
            x = [float(struct.unpack("<f", struct.pack("<f", v))[0]) for v in x]
            for l in range(L):
                p = f"model.layers.{l}."
                h = rms(x, W[p + "input_layernorm.weight"])
                q = mv(W[p + "self_attn.q_proj.weight"], h)
                k = mv(W[p + "self_attn.k_proj.weight"], h)
                v = mv(W[p + "self_attn.v_proj.weight"], h)
                f = freqs[types[l]]
                qn = (lambda v: v) if gemma2 else (lambda v: rms(v, W[p + "self_attn.q_norm.weight"]))
                kn = (lambda v: v) if gemma2 else (lambda v: rms(v, W[p + "self_attn.k_norm.weight"]))
                qs = [rope(qn(q[i * hd:(i + 1) * hd]), pos, f) for i in range(H)]
                ks = [rope(kn(k[i * hd:(i + 1) * hd]), pos, f) for i in range(KV)]
                vs = [v[i * hd:(i + 1) * hd] for i in range(KV)]
                cache[l][0].append(ks); cache[l][1].append(vs)
                att = []
                lo = pos - win + 1 if types[l] == "sliding" else 0
                for i in range(H):
                    g = i // (H // KV)
                    idx = range(max(lo, 0), pos + 1)
                    sc = [sum(a * b for a, b in zip(qs[i], cache[l][0][j][g])) * scaling for j in idx]
                    if attn_cap: sc = [attn_cap * math.tanh(x_ / attn_cap) for x_ in sc]
                    m = max(sc); e = [math.exp(s - m) for s in sc]; z = sum(e)
                    o = [0.0] * hd
                    for w_, j in zip(e, idx):
                        for c in range(hd): o[c] += w_ / z * cache[l][1][j][g][c]
                    att += o
                o = rms(mv(W[p + "self_attn.o_proj.weight"], att), W[p + "post_attention_layernorm.weight"])
                x = [a + b for a, b in zip(x, o)]
                h = rms(x, W[p + "pre_feedforward_layernorm.weight"])
                gg = mv(W[p + "mlp.gate_proj.weight"], h); uu = mv(W[p + "mlp.up_proj.weight"], h)
                d_ = mv(W[p + "mlp.down_proj.weight"], [gelu(a) * b for a, b in zip(gg, uu)])
                d_ = rms(d_, W[p + "post_feedforward_layernorm.weight"])
                x = [a + b for a, b in zip(x, d_)]
            pos += 1
        if len(out) == steps: return out, margins
        hN = rms(x, W["model.norm.weight"])
        logits = mv(LM, hN)
        if final_cap: logits = [final_cap * math.tanh(x_ / final_cap) for x_ in logits]
        best = sorted(range(len(logits)), key=lambda i: -logits[i])[:2]
        out.append(best[0]); margins.append(round(logits[best[0]] - logits[best[1]], 4))
        pending = [best[0]]
ref = json.load(open(d + "/reference.json"))
cases = []
for c in ref["cases"]:
    toks, m = run(c["prompt_token_ids"], c["max_tokens"])
    cases.append({"prompt_token_ids": c["prompt_token_ids"], "max_tokens": c["max_tokens"],
                  "expected_output_token_ids": toks, "top2_margins": m,
                  "decisive_prefix_len": next((i for i, x in enumerate(m) if x < 0.01), len(m))})
    print(len(c["prompt_token_ids"]), toks, min(m), flush=True)
with open(sys.argv[2], "w") as f:
    json.dump({"made_by": "gemma3_float64.py: plain Python, float64, greedy with a KV cache",
               "decisive_prefix_len": "steps before the first top-2 logit margin < 0.01",
               "cases": cases}, f, indent=1)
    f.write("\n")
