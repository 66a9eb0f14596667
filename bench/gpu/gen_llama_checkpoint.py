"""Random-weight Llama checkpoints and PEFT LoRA adapters for the GPU machine (which has no Node):
`config.json` + `model.safetensors` in bf16 (as Hugging Face releases store them) and
`adapters/aN/{adapter_config.json, adapter_model.safetensors}`, written tensor by tensor (a
Llama-3-8B shape never needs more than one tensor in memory). Needs torch only (no `safetensors`
package: Debian's python3-torch has none).

    python3 bench/gpu/gen_llama_checkpoint.py --out DIR --shape 1b [--layers N] [--adapters 64] [--rank 16]
    python3 bench/gpu/gen_llama_checkpoint.py --out DIR --shape 8b --adapters 64 --device cuda

Shapes: `1b` is Llama-3.2-1B (2048/8192, 16 layers, 32/8 heads of 64, vocab 128256, tied
embeddings), `8b` Llama-3-8B (4096/14336, 32 layers, 32/8 heads of 128, vocab 128256). Weights
uniform in ±1/sqrt(in), norms 1; adapters r `--rank` on all seven projections, lora_alpha 2r,
stored in `--adapter-dtype` (bf16 default, f32). Deterministic in `--seed`.
"""

import argparse
import json
import os
import struct

import torch

SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0),
}
DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32"}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_dims(c):
    """(in, out) of each projection of one layer."""
    h, hd = c["hidden_size"], c["head_dim"]
    q, kv, i = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd, c["intermediate_size"]
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def write_safetensors(path, entries, dtype, make):
    """Writes `entries` [(name, shape)] to `path` in `dtype`; `make(name, shape)` gives each tensor
    (any float dtype, any device) when its turn comes."""
    size = torch.empty((), dtype=dtype).element_size()
    header, offset = {}, 0
    for name, shape in entries:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n * size]}
        offset += n * size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape in entries:
            t = make(name, shape).to(dtype).contiguous().cpu()
            f.write(t.view(torch.uint8).numpy().tobytes() if dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--layers", type=int, help="fewer (or more) layers than the shape's")
    ap.add_argument("--adapters", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapter-dtype", choices=("bf16", "f32"), default="bf16")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where the random numbers are drawn")
    args = ap.parse_args()
    c = dict(SHAPES[args.shape])
    if args.layers is not None:
        if args.layers < 1:
            ap.error("--layers must be >= 1")
        c["num_hidden_layers"] = args.layers
    if args.adapters < 0 or args.rank < 1:
        ap.error("--adapters must be >= 0 and --rank >= 1")
    model = os.path.join(args.out, "model")
    os.makedirs(model, exist_ok=True)
    gen = torch.Generator(device=args.device)
    gen.manual_seed(args.seed)

    def uniform(shape, fan_in):
        return (torch.rand(shape, generator=gen, device=args.device) * 2 - 1) * fan_in**-0.5

    h, v, layers = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    dims = projection_dims(c)
    entries = [("model.embed_tokens.weight", (v, h)), ("model.norm.weight", (h,))]
    if not c["tie_word_embeddings"]:
        entries.append(("lm_head.weight", (v, h)))
    for l in range(layers):
        p = "model.layers.%d." % l
        entries += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
        for proj in PROJECTIONS:
            i, o = dims[proj]
            entries.append((p + ("self_attn." if proj in PROJECTIONS[:4] else "mlp.") + proj + ".weight", (o, i)))
    write_safetensors(os.path.join(model, "model.safetensors"), entries, torch.bfloat16, lambda n, s: torch.ones(s) if len(s) == 1 else uniform(s, s[-1]))
    config = dict(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5, max_position_embeddings=8192, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16", **c)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    adtype = torch.bfloat16 if args.adapter_dtype == "bf16" else torch.float32
    for a in range(args.adapters):
        d = os.path.join(args.out, "adapters", "a%d" % a)
        os.makedirs(d, exist_ok=True)
        ad = []
        for l in range(layers):
            for proj in PROJECTIONS:
                key = "base_model.model.model.layers.%d.%s.%s" % (l, "self_attn" if proj in PROJECTIONS[:4] else "mlp", proj)
                i, o = dims[proj]
                ad += [(key + ".lora_A.weight", (args.rank, i)), (key + ".lora_B.weight", (o, args.rank))]
        write_safetensors(os.path.join(d, "adapter_model.safetensors"), ad, adtype, lambda n, s: uniform(s, s[-1]) if n.endswith("lora_A.weight") else uniform(s, 4 * s[-1]))
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump(dict(peft_type="LORA", r=args.rank, lora_alpha=2 * args.rank, target_modules=list(PROJECTIONS), bias="none", modules_to_save=None, task_type="CAUSAL_LM"), f, indent=2)
    print(json.dumps({"out": args.out, "shape": args.shape, "layers": layers, "adapters": args.adapters, "rank": args.rank}))


if __name__ == "__main__":
    main()
