"""Whole model on the GPU through the torch executor's worker code (stageml_torch.Program), against
transformers + PEFT on the same GPU, and an f32 reference.

Cases (each in two numerics variants, `stageml stage --dtype bf16 --adapter-dtype f32|same`):
  fixture: the Llama fixture (fixtures/peft-tiny/llama, adapter all-r16) staged from its checkpoint
    (bundles/fixture-bf16: LoRA factors f32, the PEFT-exact default; fixture-bf16-same: bf16);
    HF loads the same checkpoint in bf16 with the PEFT adapter (PEFT keeps the factors f32).
  big8: an 8-layer 4096-wide Llama (GQA 32/8, vocab 32000), random bf16 weights drawn here, an r16
    adapter (random f32 A and B, as PEFT draws them) on all seven projections; our residuals
    (bundles/big8-bf16, big8-bf16-same, shapes only) take the same tensors as external parameters.
For the `same` variant PEFT's factors are rounded to bf16 first (both sides then hold the same
values; PEFT still computes its LoRA term in f32).

Each prompt is decoded greedily in lockstep (ours and HF, KV caches on both sides). While both
token sequences agree, every step compares each module's output (embedding, norms, projections
with their LoRA term, decoder layers, lm_head: HF forward hooks against the residual's values,
`Program.run(keep=…)`) and records the first one that differs in any bit. Prefill logits of ours and
of HF bf16 are compared with HF in f32 on the same weights (rel. error ‖x − ref‖/‖ref‖).

    python3 bench/gpu/e2e.py --root DIR --out e2e.json [--device cuda] [--cases fixture,big8] [--variants f32,same]
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


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def module_map(doc):
    """[(HF module name, residual value name)] in the residual's order: the embedding, each norm (its
    weight's reader), each projection (its base linear followed through casts and its LoRA add), each
    decoder layer's output (the input of the next norm), lm_head, and the rotary cos table."""
    vals = []  # (name, node index)
    for ni, n in enumerate(doc["nodes"]):
        for r in n["results"]:
            vals.append((r["name"], ni))
    consumers = {}
    for ni, n in enumerate(doc["nodes"]):
        for o in n["operands"]:
            consumers.setdefault(o, []).append(ni)
    nodes = doc["nodes"]
    first_id = {}
    for vid, (_, ni) in enumerate(vals):
        first_id.setdefault(ni, vid)

    def node_of(v):
        return nodes[vals[v][1]]

    def is_scaled_delta(v):
        n = node_of(v)
        return n.get("op") == "sml.mul" and any(node_of(o).get("op") == "sml.constant" for o in n["operands"])

    out = []
    norm_inputs = {}
    for ni, n in enumerate(nodes):
        if n["kind"] != "op":
            continue
        for pos, o in enumerate(n["operands"]):
            pn = node_of(o)
            if pn["kind"] != "param" or not pn["results"][0]["name"].endswith(".weight"):
                continue
            mod = pn["results"][0]["name"][: -len(".weight")]
            vid = first_id[ni]
            op = n["op"]
            if op == "sml.gather":
                out.append((vid, mod, vals[vid][0]))
            elif op in ("sml.rms_norm", "sml.mul") and "norm" in mod.split(".")[-1]:
                out.append((vid, mod, vals[vid][0]))
                x = n["operands"][0]
                if op == "sml.mul":
                    x = node_of(x)["operands"][0]
                norm_inputs[mod] = x
            elif op == "sml.linear" and pos == 1:
                v = vid
                while True:
                    cs = consumers.get(v, [])
                    if len(cs) != 1:
                        break
                    c = nodes[cs[0]]
                    if c.get("op") == "sml.cast" or (c.get("op") == "sml.add" and any(is_scaled_delta(x) for x in c["operands"] if x != v)):
                        v = first_id[cs[0]]
                        continue
                    break
                out.append((vid, mod, vals[v][0]))
    layers = sorted({int(m.split(".")[2]) for _, m, _ in out if m.startswith("model.layers.")})
    for l in layers:
        nxt = "model.layers.%d.input_layernorm" % (l + 1) if l + 1 in layers else "model.norm"
        if nxt in norm_inputs:
            v = norm_inputs[nxt]
            out.append((v, "model.layers.%d" % l, vals[v][0]))
    cos = [i for i, (nm, _) in enumerate(vals) if nm == "rope.cos.bf16"]
    if cos:
        out.append((cos[0], "model.rotary_emb", "rope.cos.bf16"))
    out.sort(key=lambda t: t[0])
    return [(m, v) for _, m, v in out]


class Hooks:
    """Forward hooks on the HF modules of `mods`, storing each output (first element of a tuple)."""

    def __init__(self, inner, mods):
        self.store = {}
        self.handles = []
        by_name = dict(inner.named_modules())
        self.missing = [m for m, _ in mods if m not in by_name]
        for m, _ in mods:
            if m in by_name:
                self.handles.append(by_name[m].register_forward_hook(self._hook(m)))

    def _hook(self, name):
        def f(_mod, _inp, out):
            self.store[name] = out[0] if isinstance(out, (tuple, list)) else out
        return f

    def remove(self):
        for h in self.handles:
            h.remove()


def first_difference(mods, ours, theirs):
    """The first module whose output differs in any bit, with max |Δ| and rel; None when all agree."""
    n_diff = 0
    first = None
    compared = 0
    for m, v in mods:
        if m not in theirs or v not in ours:
            continue
        a = ours[v].float().reshape(-1)
        b = theirs[m].float().reshape(-1)
        if a.numel() != b.numel():
            continue
        compared += 1
        d = (a - b).abs()
        if bool((d > 0).any()):
            n_diff += 1
            if first is None:
                first = {"module": m, "value": v, "max_abs": float(d.max()), "rel": rel(a, b), "elements_differing": int((d > 0).sum()), "elements": a.numel()}
    return first, n_diff, compared


def lockstep(prog, hf, inner, mods, layers, nkv, hd, prompt, steps, device, diagnose=True):
    """Greedy decode of `prompt` by ours and by HF side by side; per-step module comparison while the
    token sequences agree."""
    hooks = Hooks(inner, mods) if diagnose else None
    keep = [v for _, v in mods] if diagnose else ()
    past = {}
    for l in range(layers):
        past["past_key.%d" % l] = torch.zeros((1, nkv, 0, hd), dtype=torch.float32, device=device)
        past["past_value.%d" % l] = torch.zeros((1, nkv, 0, hd), dtype=torch.float32, device=device)
    cur_o = torch.tensor([prompt], dtype=torch.int64, device=device)
    cur_h = cur_o
    pos0 = 0
    hf_past = None
    ours_ids, hf_ids = [], []
    first_o = first_h = None
    diff = None
    prefill_modules = None
    t_o = t_h = 0.0
    for step in range(steps):
        t = cur_o.shape[1]
        inputs = dict(past)
        inputs["input_ids"] = cur_o
        inputs["position_ids"] = torch.arange(pos0, pos0 + t, device=device, dtype=torch.int64).reshape(1, t)
        inputs["attention_mask"] = torch.zeros((1, pos0 + t), dtype=torch.float32, device=device)
        sync()
        t0 = time.time()
        with torch.no_grad():
            out = prog.run(inputs, keep=keep)
        sync()
        t_o += time.time() - t0
        if hooks is not None:
            hooks.store = {}
        t0 = time.time()
        with torch.no_grad():
            r = hf(input_ids=cur_h, past_key_values=hf_past, use_cache=True)
        sync()
        t_h += time.time() - t0
        hf_past = r.past_key_values
        if first_o is None:
            first_o = out["logits"][0].float()
            first_h = r.logits[0].float()
        if hooks is not None and ours_ids == hf_ids and diff is None:
            f, n_diff, compared = first_difference(mods, out, hooks.store)
            if step == 0:
                prefill_modules = {"compared": compared, "differing": n_diff}
            if f is not None:
                diff = dict(f, step=step, modules_differing=n_diff, modules_compared=compared)
        a = int(out["logits"][0, -1].argmax())
        b = int(r.logits[0, -1].argmax())
        ours_ids.append(a)
        hf_ids.append(b)
        for l in range(layers):
            past["past_key.%d" % l] = out["present_key.%d" % l]
            past["past_value.%d" % l] = out["present_value.%d" % l]
        pos0 += t
        cur_o = torch.tensor([[a]], dtype=torch.int64, device=device)
        cur_h = torch.tensor([[b]], dtype=torch.int64, device=device)
    if hooks is not None:
        hooks.remove()
    row = {"prompt_len": len(prompt), "ours": ours_ids, "hf": hf_ids, "equal": ours_ids == hf_ids,
           "first_mismatch": next((i for i, (x, y) in enumerate(zip(ours_ids, hf_ids)) if x != y), None),
           "ours_vs_hf_bf16_logits_rel": rel(first_o, first_h), "ours_vs_hf_bf16_logits_max_abs": float((first_o - first_h).abs().max()),
           "first_differing_module": diff, "prefill_modules": prefill_modules, "ours_s": t_o, "hf_s": t_h,
           "_ours_logits": first_o, "_hf_logits": first_h}
    if hooks is not None and hooks.missing:
        row["hf_modules_missing"] = hooks.missing
    return row


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


def lora_params(model):
    return {n: p for n, p in model.named_parameters() if "lora_" in n}


def set_lora(model, saved, round_bf16):
    with torch.no_grad():
        for n, p in lora_params(model).items():
            src = saved[n]
            p.copy_(src.to(torch.bfloat16).to(p.dtype) if round_bf16 else src)


def finish(rows, hf, prompts, steps, device):
    """f32 reference (the HF model is f32 now): prefill logits and greedy tokens."""
    for r, p in zip(rows, prompts):
        with torch.no_grad():
            ref = hf(input_ids=torch.tensor([p], device=device)).logits[0].float()
        r["f32"], _ = hf_greedy(hf, p, steps, device)
        r["ours_equal_f32_prefix"] = next((i for i, (a, b) in enumerate(zip(r["ours"], r["f32"])) if a != b), steps)
        r["hf_bf16_equal_f32_prefix"] = next((i for i, (a, b) in enumerate(zip(r["hf"], r["f32"])) if a != b), steps)
        r["ours_vs_f32_rel"] = rel(r.pop("_ours_logits"), ref)
        r["hf_bf16_vs_f32_rel"] = rel(r.pop("_hf_logits"), ref)
        r["f32_first_token"] = int(ref[-1].argmax())


def summary(name, rows):
    ok = sum(r["equal"] for r in rows)
    fd = [None if r["first_differing_module"] is None else "%s@%d" % (r["first_differing_module"]["module"], r["first_differing_module"]["step"]) for r in rows]
    print("%s: greedy equal on %d of %d prompts; first differing module %s; ours vs f32 rel %s; HF bf16 vs f32 rel %s; ours vs HF rel %s" % (
        name, ok, len(rows), fd, ["%.2e" % r["ours_vs_f32_rel"] for r in rows], ["%.2e" % r["hf_bf16_vs_f32_rel"] for r in rows],
        ["%.2e" % r["ours_vs_hf_bf16_logits_rel"] for r in rows]), flush=True)


def run_variants(case, root, hf, inner, bundles, prompts, steps, cfg, device, variants, setups=None):
    """bundles: variant → (load function); setups: variant → a function preparing the HF model for it
    (called before its run and before its f32 reference). Runs each variant against HF bf16 (adapters
    f32 or rounded), then the f32 references."""
    setups = setups or {}
    saved = {n: p.detach().clone() for n, p in lora_params(hf).items()}
    out = []
    errs = []
    for var in variants:
        if var not in bundles:
            continue
        set_lora(hf, saved, round_bf16=var.startswith("same"))
        if var in setups:
            setups[var]()
        try:
            t0 = time.time()
            prog = bundles[var]()
            prep = time.time() - t0
            mods = module_map(prog.doc)
            rows = [lockstep(prog, hf, inner, mods, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, p, steps, device) for p in prompts]
            out.append({"case": case, "variant": var, "fused_lora_linears": 0,  # the worker recognises no LoRA chain any more (fuse.py deleted)
                        "prepare_s": prep, "modules_mapped": len(mods), "rows": rows})
            print("%s/%s: greedy equal %s, first differing module %s" % (case, var, [r["equal"] for r in rows], [r["first_differing_module"] for r in rows]), flush=True)
            del prog
        except Exception as e:  # noqa: BLE001 - record, run the next variant
            import traceback
            traceback.print_exc()
            errs.append({"case": case, "variant": var, "error": "%s: %s" % (type(e).__name__, e)})
        torch.cuda.empty_cache()
    hf.float()
    for r in out:
        set_lora(hf, saved, round_bf16=r["variant"].startswith("same"))
        if r["variant"] in setups:
            setups[r["variant"]]()
        finish(r["rows"], hf, prompts, steps, device)
        summary("%s/%s" % (case, r["variant"]), r["rows"])
    return out + errs


def rope_check(inner, prog_doc, device):
    """Our inverse frequencies (the rope literal) against HF's rotary_emb.inv_freq, bit for bit."""
    lit = None
    for n in prog_doc["nodes"]:
        if n.get("op") == "sml.constant" and n["results"][0]["name"] == "rope.constant":
            lit = n["attrs"]["value"]
    hf_inv = inner.model.rotary_emb.inv_freq.detach().float().cpu()
    if lit is None:
        return {"error": "no rope.constant literal"}
    ours = torch.tensor([float(v) for v in lit], dtype=torch.float32)
    return {"n": ours.numel(), "differing": int((ours != hf_inv).sum()), "max_abs": float((ours - hf_inv).abs().max()), "hf_device": str(inner.model.rotary_emb.inv_freq.device)}


def load_with(bundle_dir, device, external=None, override=None):
    """load_bundle, with some constants replaced (diagnostics: e.g. the rope table)."""
    from stageml_torch.bundle import read_manifest
    from stageml_torch.graph import Program
    from stageml_torch.safetensors_io import read_safetensors

    m = read_manifest(bundle_dir)
    graph = json.load(open(os.path.join(bundle_dir, "residual.json")))
    params = read_safetensors(os.path.join(bundle_dir, m["constants"]))
    params.update(external or {})
    params.update(override or {})
    return Program(graph, params, device)


def hf_inv_freq(base, dim, device):
    """transformers' default rope init (`1.0 / (base ** (arange(0, dim, 2) / dim))`, f32) on `device`."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))


def with_hf_rope(bundle_dir, inner, tmp):
    """A copy of the bundle whose rope literal is HF's inv_freq (diagnostic: isolates the rope table)."""
    import shutil

    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    shutil.copytree(bundle_dir, tmp)
    doc = json.load(open(os.path.join(tmp, "residual.json")))
    hf_inv = inner.model.rotary_emb.inv_freq.detach().float().cpu().tolist()
    for n in doc["nodes"]:
        if n.get("op") == "sml.constant" and n["results"][0]["name"] == "rope.constant":
            n["attrs"]["value"] = hf_inv
    with open(os.path.join(tmp, "residual.json"), "w") as f:
        json.dump(doc, f)
    return tmp


def case_fixture(root, device, variants):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from stageml_torch.bundle import load_bundle

    fx = os.path.join(root, "fixtures", "peft-tiny")
    golden = json.load(open(os.path.join(fx, "golden.json")))
    prompts = [golden["llama.all-r16"]["prompt%d" % i]["input_ids"] for i in range(4)]
    base = AutoModelForCausalLM.from_pretrained(os.path.join(fx, "llama", "base"), dtype=torch.bfloat16).to(device)
    hf = PeftModel.from_pretrained(base, os.path.join(fx, "llama", "adapters", "all-r16")).to(device).eval()
    lora_dtypes = sorted({str(p.dtype) for p in lora_params(hf).values()})
    bundles = {"f32": lambda: load_bundle(os.path.join(root, "bundles", "fixture-bf16"), device),
               "same": lambda: load_bundle(os.path.join(root, "bundles", "fixture-bf16-same"), device)}
    inner = hf.base_model.model
    doc = json.load(open(os.path.join(root, "bundles", "fixture-bf16", "residual.json")))
    rope = rope_check(inner, doc, device)
    if rope.get("differing", 0) > 0:
        bundles["f32-hf-rope"] = lambda: load_bundle(with_hf_rope(os.path.join(root, "bundles", "fixture-bf16"), inner, "/tmp/fixture-hf-rope"), device)
        variants = variants + ["f32-hf-rope"]
    res = run_variants("fixture", root, hf, inner, bundles, prompts, 12, base.config, device, variants)
    for r in res:
        r["peft_lora_dtypes"] = lora_dtypes
        r["rope_inv_freq"] = rope
        r["attn_implementation"] = getattr(inner.config, "_attn_implementation", None)
    return res


def case_big8(root, device, variants):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    from stageml_torch.bundle import load_bundle
    from stageml_torch.safetensors_io import read_safetensors

    cj = json.load(open(os.path.join(root, "bundles", "big8-config.json")))
    cfg = LlamaConfig(**{k: v for k, v in cj.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    with torch.device(device):
        base = LlamaForCausalLM(cfg).to(torch.bfloat16)
    lcfg = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], init_lora_weights=False, lora_dropout=0.0)
    hf = get_peft_model(base, lcfg).eval()
    lora_dtypes = sorted({str(p.dtype) for p in lora_params(hf).values()})
    inner = hf.base_model.model

    def params(dt):
        ps = {}
        for name, mod in inner.named_modules():
            if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
                ps["%s.weight" % name] = mod.base_layer.weight
                ps["adapter.big.%s.lora_A" % name] = mod.lora_A["default"].weight.detach().to(dt)
                ps["adapter.big.%s.lora_B" % name] = mod.lora_B["default"].weight.detach().to(dt)
                assert abs(mod.scaling["default"] - 2.0) < 1e-9
        for name, p in inner.named_parameters():
            if "lora_" not in name and "base_layer" not in name:
                ps[name] = p
        return ps

    bundles = {"f32": lambda: load_bundle(os.path.join(root, "bundles", "big8-bf16"), device, external=params(torch.float32)),
               "same": lambda: load_bundle(os.path.join(root, "bundles", "big8-bf16-same"), device, external=params(torch.bfloat16))}
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in (5, 17, 33)]
    # The bundle's rope table (a constant here) against HF's inv_freq buffer. Measured on the H200
    # (bench/results/gpu-e2e.md): `LlamaForCausalLM(cfg).to(torch.bfloat16)` casts that buffer to
    # bf16 too (63 of 64 values differ from the f32 table, max |Δ| 1.79e-3, exactly the bf16
    # rounding of ours), where from_pretrained(dtype=bf16) keeps it f32 (the fixture: equal).
    # Copying an f32 table into the bf16 buffer rounds it again, so the f32/same variants run
    # against HF's bf16-rounded table; f32-hf-cuda-rope gives ours HF's table (the buffer as built).
    ours_inv = read_safetensors(os.path.join(root, "bundles", "big8-bf16", "constants.safetensors"))["rope.constant"].float()
    rot = inner.model.rotary_emb
    cuda_inv = rot.inv_freq.detach().clone()
    cpu_inv = hf_inv_freq(cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None) else cfg.rope_theta, cfg.head_dim, "cpu")
    formula_cuda = hf_inv_freq(cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None) else cfg.rope_theta, cfg.head_dim, device)
    rope = {"n": ours_inv.numel(),
            "ours_vs_hf_cuda_differing": int((ours_inv != cuda_inv.cpu()).sum()), "ours_vs_hf_cuda_max_abs": float((ours_inv - cuda_inv.cpu()).abs().max()),
            "ours_vs_cpu_formula_differing": int((ours_inv != cpu_inv).sum()),
            "hf_buffer_vs_cuda_formula_differing": int((cuda_inv != formula_cuda).sum()),
            "hf_device": str(cuda_inv.device)}
    print("big8 rope: %s" % rope, flush=True)

    def set_rope(inv):
        def f():
            with torch.no_grad():
                rot.inv_freq.copy_(inv.to(rot.inv_freq.device))
                if hasattr(rot, "original_inv_freq") and isinstance(rot.original_inv_freq, torch.Tensor):
                    rot.original_inv_freq.copy_(inv.to(rot.original_inv_freq.device))
        return f

    def f32_rope(inv):
        # As from_pretrained(dtype=bf16) leaves it: the rotary buffer in f32 (registered anew, so
        # the bf16 buffer `.to(bfloat16)` made is replaced rather than written into).
        def f():
            rot.register_buffer("inv_freq", inv.to(device=cuda_inv.device, dtype=torch.float32), persistent=False)
            if hasattr(rot, "original_inv_freq") and isinstance(rot.original_inv_freq, torch.Tensor):
                rot.original_inv_freq = inv.to(device=cuda_inv.device, dtype=torch.float32)
        return f

    # f32, same: HF with its rotary buffer in f32 (as from_pretrained builds it);
    # f32-hf-cuda-rope: ours given the bf16-rounded table `.to(bfloat16)` makes, HF using it too.
    bundles["f32-hf-cuda-rope"] = lambda: load_with(os.path.join(root, "bundles", "big8-bf16"), device, external=params(torch.float32), override={"rope.constant": cuda_inv.float().cpu()})
    setups = {"f32": f32_rope(cpu_inv), "same": f32_rope(cpu_inv), "f32-hf-cuda-rope": f32_rope(cuda_inv.float())}
    variants = variants + ["f32-hf-cuda-rope"]
    res = run_variants("big8", root, hf, inner, bundles, prompts, 16, cfg, device, variants, setups)
    for r in res:
        r["config"] = cj
        r["adapter"] = "r16 alpha 32 on q,k,v,o,gate,up,down (random A and B)"
        r["peft_lora_dtypes"] = lora_dtypes
        r["rope_inv_freq"] = rope
        r["attn_implementation"] = getattr(inner.config, "_attn_implementation", None)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", required=True, help="directory holding bundles/ and fixtures/")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cases", default="fixture,big8")
    ap.add_argument("--variants", default="f32,same")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(args.root, "native"))
    import transformers, peft  # noqa: E401
    from stageml_torch import bank

    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu", "fuse_mode": bank.mode(),
            "allow_tf32": torch.backends.cuda.matmul.allow_tf32}
    results = []
    variants = args.variants.split(",")
    for c in args.cases.split(","):
        t0 = time.time()
        try:
            rs = {"fixture": case_fixture, "big8": case_big8}[c](args.root, args.device, variants)
            for r in rs:
                r["case_seconds"] = time.time() - t0
            results.extend(rs)
        except Exception as e:  # noqa: BLE001 - record the failure, run the next case
            import traceback
            traceback.print_exc()
            results.append({"case": c, "error": "%s: %s" % (type(e).__name__, e)})
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
