"""Writes a random-weight bf16 Llama checkpoint of a real model's shape and N PEFT LoRA adapters,
with transformers and PEFT as a user's checkpoint would be written (save_pretrained, safetensors).

    python3 bench/gpu/serve/gen.py --shape 1b --adapters 64 --rank 16 --out /tmp/serve-model

Shapes: `1b` Llama-3.2-1B (16 layers, 2048/8192, GQA 32/8, vocab 128,256, tied embeddings, llama3
rope), `8b` Llama-3-8B (32 layers, 4096/14336, GQA 32/8, vocab 128,256), `small` SmolLM2-135M
(30 layers, 576/1536, GQA 9/3, vocab 49,152, tied). The tokenizer is a word-level one over the
whole vocabulary (id i is the word `wI`; ids 0-2 are special), so every generated id detokenizes to
text and the server streams one chunk per token (a smaller tokenizer would leave most ids without
text, and the stream without per-token chunks). Adapters: r RANK, alpha 2·RANK, on all
seven projections, factors drawn from N(0, 0.02) with a seed per adapter (lora_B non-zero, so
every adapter changes the logits), saved as PEFT saves them.
"""
import argparse
import json
import os
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
               head_dim=64, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0, max_position_embeddings=131072,
               rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               head_dim=128, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0, max_position_embeddings=8192),
    "small": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                  head_dim=64, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0, max_position_embeddings=8192),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_tokenizer(model_dir, vocab_size):
    """A word-level tokenizer covering every id: `<tI>` for the special ids 0-2, `wI` otherwise."""
    vocab = {(f"<t{i}>" if i < 3 else f"w{i}"): i for i in range(vocab_size)}
    special = [{"id": i, "content": f"<t{i}>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True} for i in range(3)]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
           "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
           "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
           "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<t0>"}}
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<t1>", "eos_token": "<t2>", "unk_token": "<t0>", "tokenizer_class": "PreTrainedTokenizerFast"}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--adapters", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPES[a.shape], rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model_dir = os.path.join(a.out, "model")
    model.save_pretrained(model_dir, safe_serialization=True)
    write_tokenizer(model_dir, cfg.vocab_size)
    print(f"model {a.shape}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, {time.time() - t0:.1f} s", flush=True)
    if a.adapters > 0:
        from peft import LoraConfig, get_peft_model
        peft_model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=2 * a.rank, target_modules=TARGETS, lora_dropout=0.0))
        lora = [(n, p) for n, p in peft_model.named_parameters() if "lora_" in n]
        for i in range(a.adapters):
            g = torch.Generator(device=lora[0][1].device).manual_seed(1000 + i)
            with torch.no_grad():
                for _, p in lora:
                    p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32).to(p.dtype) * 0.02)
            peft_model.save_pretrained(os.path.join(a.out, "adapters", f"a{i:02d}"))
        print(f"{a.adapters} adapters r{a.rank}: {time.time() - t0:.1f} s", flush=True)
    with open(os.path.join(a.out, "shape.json"), "w") as f:
        json.dump({"shape": a.shape, "adapters": a.adapters, "rank": a.rank, "config": SHAPES[a.shape]}, f)


if __name__ == "__main__":
    main()
