"""Golden fixtures for every PEFT adapter kind (issue 35, item 3), made by the real libraries
(transformers 5.17, PEFT 0.21), small enough to commit (< 5 MB).

Two tiny random models, written under OUT/<model>/ (config.json, model.safetensors):
  qwen2      Qwen2 with tied embeddings (q/k/v carry a base bias, so DoRA's bias handling is exercised)
  qwen3_moe  Qwen3-MoE with fused expert tensors (mlp.experts.gate_up_proj / down_proj) and a router

and one PEFT adapter per kind under OUT/<model>/adapters/<kind>/ (save_pretrained of a fresh
get_peft_model on a copy of the base, so no adapter sees another):
  qwen2:     lora (plain, q/v/down), lora-bias (lora_bias on q/v/down), dora (use_dora on q/v/down),
             tokens (trainable_token_indices on the tied embedding), head (modules_to_save=["lm_head"])
  qwen3_moe: lora (q/v), experts (target_parameters on the fused expert tensors), router
             (target_parameters on the router weight)
Every trainable tensor PEFT initializes to a no-op (DoRA magnitudes, token rows, the saved head) is
perturbed, so each kind changes the logits.

OUT/golden.json       per model: the fixed token ids of each prompt, the adapters made (and notes on
                      any PEFT refused), versions
OUT/golden.safetensors  f32 logits [T, V] of every prompt at every position, base and every adapter,
                      through PEFT on CPU in float32 with eager attention

Run (torch, transformers 5.17, peft 0.21, safetensors; no network needed):
    python3 tools/gen_adapter_kinds.py --out fixtures/peft-kinds
"""
import argparse
import copy
import json
import os
import shutil
import traceback

import torch
from safetensors.torch import save_file

AP = argparse.ArgumentParser(description=__doc__.split("\n")[0])
AP.add_argument("--out", required=True, help="output directory")
ARGS = AP.parse_args()

import transformers  # noqa: E402
import peft  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402

OUT = ARGS.out
VERSIONS = {m.__name__: m.__version__ for m in (torch, transformers, peft)}
print(VERSIONS, flush=True)

# Fixed ids (no tokenizer): two prompts of different lengths; the token rows the trainable-tokens
# adapter replaces (3, 17, 40) occur in both.
PROMPTS = [[1, 3, 17, 5, 40, 9, 3, 60], [2, 40, 11, 17, 7]]
TOKEN_INDICES = [3, 17, 40]
QV_DOWN = ["q_proj", "v_proj", "down_proj"]

MODELS = {
    "qwen2": dict(
        config="Qwen2Config", model="Qwen2ForCausalLM",
        kwargs=dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                    tie_word_embeddings=True, use_sliding_window=False, bos_token_id=1, eos_token_id=2,
                    pad_token_id=None, attn_implementation="eager"),
        adapters={
            "lora": dict(r=4, lora_alpha=8, target_modules=QV_DOWN),
            "lora-bias": dict(r=4, lora_alpha=8, lora_bias=True, target_modules=QV_DOWN),
            "dora": dict(r=4, lora_alpha=8, use_dora=True, target_modules=QV_DOWN),
            "tokens": dict(r=2, lora_alpha=4, target_modules=["q_proj"], trainable_token_indices=TOKEN_INDICES),
            "head": dict(r=2, lora_alpha=4, target_modules=["v_proj"], modules_to_save=["lm_head"]),
        }),
    "qwen3_moe": dict(
        config="Qwen3MoeConfig", model="Qwen3MoeForCausalLM",
        kwargs=dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                    use_sliding_window=False, sliding_window=None, decoder_sparse_step=1, num_experts=4,
                    num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[], bos_token_id=1, eos_token_id=2,
                    pad_token_id=None, attn_implementation="eager"),
        adapters={
            "lora": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
            "experts": dict(r=2, lora_alpha=4, target_modules=[],
                            target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
            "router": dict(r=2, lora_alpha=4, target_modules=[], target_parameters=["mlp.gate.weight"]),
        }),
}


def perturb(model, scale=0.05):
    """Random model weights with every norm weight moved off 1 (an untrained norm hides bugs)."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(scale * torch.randn(p.shape, generator=g))


def perturb_adapter(pm, seed):
    """Moves the trainable tensors PEFT initializes to a no-op away from it."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if not p.requires_grad and "modules_to_save" not in name and "token_adapter" not in name:
                continue
            if "lora_magnitude_vector" in name:
                p.mul_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "trainable_tokens_delta" in name or "modules_to_save" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
            elif "lora_B" in name and name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def logits_of(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float().contiguous()


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    meta = {"versions": VERSIONS, "prompt_ids": PROMPTS, "token_indices": TOKEN_INDICES, "models": {}}
    tensors = {}
    for mname, spec in MODELS.items():
        torch.manual_seed(35)
        cfg = getattr(transformers, spec["config"])(**spec["kwargs"])
        model = getattr(transformers, spec["model"])(cfg).float().eval()
        perturb(model)
        root = os.path.join(OUT, mname)
        model.save_pretrained(root)
        gc = os.path.join(root, "generation_config.json")
        if os.path.exists(gc):
            os.remove(gc)
        m = {"adapters": {}, "notes": []}
        meta["models"][mname] = m
        for i, ids in enumerate(PROMPTS):
            tensors[f"{mname}.base.prompt{i}"] = logits_of(model, ids)
        for seed, (aname, kw) in enumerate(spec["adapters"].items()):
            try:
                torch.manual_seed(100 + seed)
                lc = LoraConfig(lora_dropout=0.0, init_lora_weights=False, bias="none", **kw)
                pm = get_peft_model(copy.deepcopy(model), lc)
                perturb_adapter(pm, 200 + seed)
                pm.eval()
                adir = os.path.join(root, "adapters", aname)
                pm.save_pretrained(adir)
                for i, ids in enumerate(PROMPTS):
                    t = logits_of(pm, ids)
                    base = tensors[f"{mname}.base.prompt{i}"]
                    if torch.allclose(t, base, atol=1e-4):
                        m["notes"].append(f"{aname}: logits equal the base model's on prompt {i}")
                    tensors[f"{mname}.{aname}.prompt{i}"] = t
                with open(os.path.join(adir, "adapter_config.json")) as f:
                    saved = json.load(f)
                m["adapters"][aname] = {"config": kw, "saved_keys": sorted(_keys(adir)), "peft_type": saved.get("peft_type")}
            except Exception as e:  # recorded: the tests read which adapters exist
                traceback.print_exc()
                m["notes"].append(f"{aname}: PEFT failed: {e!r}")
    save_file(tensors, os.path.join(OUT, "golden.safetensors"))
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta, indent=1))


def _keys(adir):
    from safetensors import safe_open
    with safe_open(os.path.join(adir, "adapter_model.safetensors"), "pt") as f:
        return list(f.keys())


main()
