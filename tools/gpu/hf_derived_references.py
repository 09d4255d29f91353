#!/usr/bin/env python3
"""Transformers' greedy tokens for the derived fixtures (tests/model/hf_derived).

Each entry of derived.json names a shared fixture (shared/models/hf/NAME),
or a generated one ("generated": NAME, hf_generated/NAME beside the
manifest's folder: tests/model/hf_generated/make_fixtures.py), and the
config.json keys to set on it (Python's dict.update; the weights stay the
same), and optionally ("wrap") a multimodal class to nest it in, as the
Hub stores such a checkpoint (text_config; tensors under language_model.).
For each, this writes NAME.reference.json in the shared fixtures'
layout: the fixture's own prompts, plain greedy (the whole sequence through
the model at every step, argmax, no EOS handling), fp32, eager attention, on
the CPU, with the top-2 logit margin of every step and the decisive prefix
(the steps before the first margin under 0.01). Needs torch and
transformers (the GPU machines have them; run.sh calls this there):

  python3 hf_derived_references.py DERIVED_JSON SHARED_HF_DIR OUT_DIR

Copy OUT_DIR/*.reference.json into tests/model/hf_derived/; model_hf_families_test
(HfDerivedTest) then compares Tandem's tokens with them.
"""
import json
import os
import sys
import tempfile


def wrapped_config(cfg, wrap):
    """A causal LM's config nested as a multimodal checkpoint's text_config
    ("wrap": its architecture, model_type and other top-level keys); its
    vision tower is not in the weights, and text-only prompts never reach it."""
    text = dict(cfg)
    text.pop("architectures", None)
    top = {"architectures": [wrap["architecture"]], "model_type": wrap["model_type"],
           "text_config": text}
    top.update(wrap.get("top", {}))
    return top


def write_hub_layout(src, dst):
    """The safetensors file `src` with its tensors renamed as the Hub stores a
    multimodal checkpoint's language model: model.* -> language_model.model.*,
    lm_head.weight -> language_model.lm_head.weight (the bytes unchanged)."""
    import struct
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    renamed = {}
    for name, info in header.items():
        if name == "lm_head.weight":
            name = "language_model.lm_head.weight"
        elif name.startswith("model."):
            name = "language_model." + name
        renamed[name] = info
    text = json.dumps(renamed).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    manifest_path, shared, out = sys.argv[1:]
    shared = os.path.abspath(shared)  # the symlinks below must not be relative
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        print(f"skipped: {e} (torch and transformers are needed)")
        return 0
    torch.manual_seed(0)
    os.makedirs(out, exist_ok=True)
    with open(manifest_path) as f:
        manifest = json.load(f)
    failed = []
    generated = os.path.join(os.path.dirname(os.path.abspath(manifest_path)), "..", "hf_generated")
    for name, entry in manifest.items():
        src = (os.path.join(generated, entry["generated"]) if "generated" in entry
               else os.path.join(shared, entry["fixture"]))
        try:
            with tempfile.TemporaryDirectory() as tmp:
                wrap = entry.get("wrap")
                for f in os.listdir(src):
                    if f not in ("config.json", "reference.json") and not (wrap and f == "model.safetensors"):
                        os.symlink(os.path.join(src, f), os.path.join(tmp, f))
                with open(os.path.join(src, "config.json")) as f:
                    cfg = json.load(f)
                cfg.update(entry["config"])
                loader = AutoModelForCausalLM
                if wrap:
                    cfg = wrapped_config(cfg, wrap)
                    write_hub_layout(os.path.join(src, "model.safetensors"),
                                     os.path.join(tmp, "model.safetensors"))
                    loader = getattr(transformers, wrap["architecture"])
                with open(os.path.join(tmp, "config.json"), "w") as f:
                    json.dump(cfg, f, indent=1)
                try:
                    model = loader.from_pretrained(
                        tmp, dtype=torch.float32, attn_implementation="eager")
                except TypeError:  # transformers 4: torch_dtype
                    model = loader.from_pretrained(
                        tmp, torch_dtype=torch.float32, attn_implementation="eager")
                model.eval()
                with open(os.path.join(src, "reference.json")) as f:
                    base = json.load(f)
                cases = []
                for case in base["cases"]:
                    ids = list(case["prompt_token_ids"])
                    tokens, margins = [], []
                    with torch.no_grad():
                        for _ in range(case["max_tokens"]):
                            logits = model(torch.tensor([ids])).logits[0, -1].float()
                            top = torch.topk(logits, 2)
                            token = int(top.indices[0])
                            margins.append(round(float(top.values[0] - top.values[1]), 5))
                            ids.append(token)
                            tokens.append(token)
                    decisive = next((i for i, m in enumerate(margins) if m < 0.01), len(margins))
                    cases.append({
                        "prompt_token_ids": case["prompt_token_ids"],
                        "max_tokens": case["max_tokens"],
                        "expected_output_token_ids": tokens,
                        "top2_margins": margins,
                        "decisive_prefix_len": decisive,
                    })
                reference = {
                    "made_by": (f"transformers {transformers.__version__} (torch {torch.__version__}), "
                                f"{type(model).__name__}, fp32, eager attention, CPU; plain greedy: "
                                "whole-sequence forward, argmax, no EOS handling; "
                                f"{'generated' if 'generated' in entry else 'shared/models/hf'}/"
                                f"{entry.get('generated') or entry['fixture']} with config.json keys "
                                f"{json.dumps(entry['config'], sort_keys=True)}"
                                + (f", as a {wrap['architecture']} in the Hub's layout" if wrap else "")),
                    "decisive_prefix_len": "steps before the first top-2 logit margin < 0.01",
                    "cases": cases,
                }
                with open(os.path.join(out, f"{name}.reference.json"), "w") as f:
                    json.dump(reference, f, indent=1)
                print(f"{name}: {len(cases)} cases, decisive prefixes "
                      f"{[c['decisive_prefix_len'] for c in cases]}")
        except Exception as e:  # one entry's failure leaves the others
            print(f"{name}: FAILED: {type(e).__name__}: {e}")
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
