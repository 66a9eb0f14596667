"""Whole model on the GPU through the torch executor's worker code (stageml_torch.Program), against
transformers + PEFT on the same GPU, and an f32 reference.

Cases:
  fixture: the Llama fixture (fixtures/peft-tiny/llama, adapter all-r16) staged with
    `stageml stage --dtype bf16` (bundles/fixture-bf16, constants from the real checkpoint);
    HF loads the same checkpoint in bf16 with the PEFT adapter.
  big8: an 8-layer 4096-wide Llama (GQA 32/8, vocab 32000), random bf16 weights drawn here, an r16
    adapter (random A and B) on all seven projections; our residual (bundles/big8-bf16, shapes only)
    takes the same tensors as external parameters.
Each: greedy tokens (manual loop, KV cache, both sides) on several prompts; prefill logits of ours
and of HF bf16 against HF in f32 on the same bf16-rounded weights (rel. error ‖x − ref‖/‖ref‖).

    python3 bench/gpu/e2e.py --root DIR --out e2e.json [--device cuda] [--cases fixture,big8]
"""
import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def rel(a, b):
    a = a.double()
    b = b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def ours_greedy(prog, layers, nkv, hd, prompt, steps, device):
    """Greedy decode through the residual: prefill, then one token at a time with the KV cache."""
    ids = torch.tensor([prompt], dtype=torch.int64, device=device)
    past = {}
    for l in range(layers):
        past["past_key.%d" % l] = torch.zeros((1, nkv, 0, hd), dtype=torch.float32, device=device)
        past["past_value.%d" % l] = torch.zeros((1, nkv, 0, hd), dtype=torch.float32, device=device)
    pos0 = 0
    out_ids = []
    first_logits = None
    cur = ids
    for step in range(steps):
        t = cur.shape[1]
        inputs = dict(past)
        inputs["input_ids"] = cur
        inputs["position_ids"] = torch.arange(pos0, pos0 + t, device=device, dtype=torch.int64).reshape(1, t)
        inputs["attention_mask"] = torch.zeros((1, pos0 + t), dtype=torch.float32, device=device)
        with torch.no_grad():
            out = prog.run(inputs)
        logits = out["logits"]
        if first_logits is None:
            first_logits = logits[0].float()
        nxt = int(logits[0, -1].argmax())
        out_ids.append(nxt)
        for l in range(layers):
            past["past_key.%d" % l] = out["present_key.%d" % l]
            past["past_value.%d" % l] = out["present_value.%d" % l]
        pos0 += t
        cur = torch.tensor([[nxt]], dtype=torch.int64, device=device)
    return out_ids, first_logits


def hf_greedy(model, prompt, steps, device):
    ids = torch.tensor([prompt], dtype=torch.int64, device=device)
    out_ids = []
    first = None
    past = None
    cur = ids
    with torch.no_grad():
        for _ in range(steps):
            r = model(input_ids=cur, past_key_values=past, use_cache=True)
            past = r.past_key_values
            if first is None:
                first = r.logits[0].float()
            nxt = int(r.logits[0, -1].argmax())
            out_ids.append(nxt)
            cur = torch.tensor([[nxt]], dtype=torch.int64, device=device)
    return out_ids, first


def round_adapters_to_bf16(model):
    """PEFT keeps adapter factors in f32 on a bf16 base; our bf16 residual holds them rounded to
    bf16. Round PEFT's copies the same way, so both sides compute with the same values."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(p.to(torch.bfloat16).to(p.dtype))


def hf_logits(model, prompt, device):
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt], device=device)).logits[0].float()


def compare(name, prog, hf, layers, nkv, hd, prompts, steps, device, to_f32):
    rows = []
    for p in prompts:
        t0 = time.time()
        ours_ids, ours_logits = ours_greedy(prog, layers, nkv, hd, p, steps, device)
        t_ours = time.time() - t0
        t0 = time.time()
        hf_ids, hf_first = hf_greedy(hf, p, steps, device)
        t_hf = time.time() - t0
        rows.append({"prompt_len": len(p), "ours": ours_ids, "hf": hf_ids, "equal": ours_ids == hf_ids,
                     "ours_vs_hf_bf16_logits_rel": rel(ours_logits, hf_first), "ours_s": t_ours, "hf_s": t_hf,
                     "first_mismatch": next((i for i, (a, b) in enumerate(zip(ours_ids, hf_ids)) if a != b), None),
                     "_ours_logits": ours_logits, "_hf_logits": hf_first})
    to_f32()
    for r, p in zip(rows, prompts):
        ref = hf_logits(hf, p, device)
        r["f32"], _ = hf_greedy(hf, p, steps, device)
        r["ours_equal_f32_prefix"] = next((i for i, (a, b) in enumerate(zip(r["ours"], r["f32"])) if a != b), steps)
        r["hf_bf16_equal_f32_prefix"] = next((i for i, (a, b) in enumerate(zip(r["hf"], r["f32"])) if a != b), steps)
        r["ours_vs_f32_rel"] = rel(r.pop("_ours_logits"), ref)
        r["hf_bf16_vs_f32_rel"] = rel(r.pop("_hf_logits"), ref)
        # Greedy argmax of the prefill's last position under the f32 reference.
        r["f32_first_token"] = int(ref[-1].argmax())
    ok = sum(r["equal"] for r in rows)
    print("%s: greedy equal on %d of %d prompts; tokens agreeing with f32 greedy: ours %s, HF bf16 %s; ours vs f32 rel %s; HF bf16 vs f32 rel %s" % (
        name, ok, len(rows), [r["ours_equal_f32_prefix"] for r in rows], [r["hf_bf16_equal_f32_prefix"] for r in rows], ["%.2e" % r["ours_vs_f32_rel"] for r in rows], ["%.2e" % r["hf_bf16_vs_f32_rel"] for r in rows]), flush=True)
    return rows


def case_fixture(root, device):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from stageml_torch.bundle import load_bundle

    prog = load_bundle(os.path.join(root, "bundles", "fixture-bf16"), device)
    fx = os.path.join(root, "fixtures", "peft-tiny")
    golden = json.load(open(os.path.join(fx, "golden.json")))
    prompts = [golden["llama.all-r16"]["prompt%d" % i]["input_ids"] for i in range(4)]
    base = AutoModelForCausalLM.from_pretrained(os.path.join(fx, "llama", "base"), dtype=torch.bfloat16).to(device)
    hf = PeftModel.from_pretrained(base, os.path.join(fx, "llama", "adapters", "all-r16")).to(device).eval()
    round_adapters_to_bf16(hf)
    cfg = base.config
    rows = compare("fixture", prog, hf, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, prompts, 12, device, lambda: hf.float())
    return {"case": "fixture", "fused_lora_linears": prog.fused, "bundle": "fixture-bf16 (stageml stage --dtype bf16 of fixtures/peft-tiny/llama + all-r16)", "rows": rows}


def case_big8(root, device):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    from stageml_torch.bundle import load_bundle

    cj = json.load(open(os.path.join(root, "bundles", "big8-config.json")))
    cfg = LlamaConfig(**{k: v for k, v in cj.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    with torch.device(device):
        base = LlamaForCausalLM(cfg).to(torch.bfloat16)
    lcfg = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], init_lora_weights=False, lora_dropout=0.0)
    hf = get_peft_model(base, lcfg).eval()
    round_adapters_to_bf16(hf)
    params = {}
    inner = hf.base_model.model
    for name, mod in inner.named_modules():
        if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
            params["%s.weight" % name] = mod.base_layer.weight
            params["adapter.big.%s.lora_A" % name] = mod.lora_A["default"].weight.to(torch.bfloat16)
            params["adapter.big.%s.lora_B" % name] = mod.lora_B["default"].weight.to(torch.bfloat16)
            assert abs(mod.scaling["default"] - 2.0) < 1e-9
    for name, p in inner.named_parameters():
        if "lora_" not in name and "base_layer" not in name:
            params[name] = p
    t0 = time.time()
    prog = load_bundle(os.path.join(root, "bundles", "big8-bf16"), device, external=params)
    print("big8: prepared in %.1f s, %d parameters" % (time.time() - t0, len(params)), flush=True)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in (5, 17, 33)]
    rows = compare("big8", prog, hf, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, prompts, 16, device, lambda: hf.float())
    return {"case": "big8", "fused_lora_linears": prog.fused, "config": cj, "adapter": "r16 alpha 32 on q,k,v,o,gate,up,down (random A and B)", "rows": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", required=True, help="directory holding bundles/ and fixtures/")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cases", default="fixture,big8")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(args.root, "native"))
    import transformers, peft  # noqa: E401

    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"}
    results = []
    for c in args.cases.split(","):
        t0 = time.time()
        try:
            r = {"fixture": case_fixture, "big8": case_big8}[c](args.root, args.device)
            r["seconds"] = time.time() - t0
            results.append(r)
        except Exception as e:  # noqa: BLE001 - record the failure, run the next case
            import traceback
            traceback.print_exc()
            results.append({"case": c, "error": "%s: %s" % (type(e).__name__, e)})
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
