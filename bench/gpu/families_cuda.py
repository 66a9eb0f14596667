"""Issue 36's families in bfloat16 on CUDA: the torch worker's program against transformers.

For every family of fixtures/hf-families and every model (the base and each PEFT adapter), runs the
residual bundle `stageml stage --dtype bf16` wrote for it (bench/gpu/prepare-families.sh, run where
Node is; the bundles are plain files: residual.json + constants.safetensors) in the worker's own
Program (`stageml_torch.bundle.load_bundle`, the code the torch executor runs) on CUDA, greedily for
16 tokens on each golden prompt, with the KV cache carried between steps as the worker returns it.
The same prompts go through transformers in bfloat16 on the same device (AutoModelForCausalLM
.from_pretrained(dtype=torch.bfloat16), PeftModel for an adapter, `generate` with do_sample=False,
eager attention), and through the f32 goldens of golden.json for reference. Writes one JSON:
per family, model and prompt the three token lists, whether ours equals transformers' bf16, and the
first position where they part (bf16 rounding differs between the two programs — matmul order,
fused norms — so a near tie may part late; the summary counts exact sequences and agreeing prefixes).

No Node is needed here. Usage (repository root on the GPU machine, Python with torch + CUDA, and
transformers 5.17 / peft 0.21 for the comparison; without them --no-transformers records ours and
the f32 goldens only):

    bash bench/gpu/prepare-families.sh            # where Node runs: writes bench/gpu/out/families
    python3 bench/gpu/families_cuda.py --bundles bench/gpu/out/families --out bench/results/gpu-families-bf16.json
"""
import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "native"))
from stageml_torch.bundle import load_bundle  # noqa: E402

STEPS = 16


def ours_greedy(prog, ids, device, steps):
    """Greedy tokens of the residual program: the prompt in one run (past = 0), then one token per
    run with the present keys/values of the previous run fed back as the past."""
    declared = dict(prog.inputs)
    types = prog.value_types
    layers = sorted(int(n.split(".")[1]) for n, _ in prog.inputs if n.startswith("past_key."))
    past = {}
    for l in layers:
        for kv in ("key", "value"):
            _, dt, shape = types[declared["past_%s.%d" % (kv, l)]]
            past["past_%s.%d" % (kv, l)] = torch.zeros((1, int(shape[1]), 0, int(shape[3])), dtype=torch.float32, device=device)
    out = []
    tokens = list(ids)
    pos = 0
    for _ in range(steps):
        n = len(tokens)
        x = {
            "input_ids": torch.tensor([tokens], dtype=torch.int64, device=device),
            "position_ids": torch.arange(pos, pos + n, dtype=torch.int64, device=device).reshape(1, -1),
            "attention_mask": torch.zeros((1, pos + n), dtype=torch.float32, device=device),
        }
        x.update(past)
        y = prog.run(x)
        nxt = int(torch.argmax(y["logits"][0, -1].float()).item())
        out.append(nxt)
        for l in layers:
            for kv in ("key", "value"):
                past["past_%s.%d" % (kv, l)] = y["present_%s.%d" % (kv, l)].float()
        pos += n
        tokens = [nxt]
    return out


def hf_greedy(model_dir, adapter_dir, prompts, device, steps):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="eager").to(device)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir).to(device)
    model.eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids], dtype=torch.int64, device=device)
            g = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0)
            outs.append([int(t) for t in g[0, len(ids):].tolist()])
    return outs


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundles", required=True, help="the directory prepare-families.sh wrote (<family>/<model>/residual.json)")
    ap.add_argument("--fixtures", default=os.path.join(ROOT, "fixtures", "hf-families"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--families", default=None, help="comma-separated subset")
    ap.add_argument("--no-transformers", action="store_true", help="record ours and the f32 goldens only")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("families_cuda.py: CUDA is not available (give --device cpu for a dry run)")
    golden = json.load(open(os.path.join(args.fixtures, "golden.json")))
    families = args.families.split(",") if args.families else golden["families"]
    versions = {"torch": torch.__version__}
    if not args.no_transformers:
        import peft
        import transformers

        versions.update(transformers=transformers.__version__, peft=peft.__version__)
    doc = {"suite": "gpu-families-bf16", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else args.device, "versions": versions, "steps": STEPS, "families": {}}
    total = equal = 0
    for fam in families:
        g = golden[fam]
        models = ["base"] + sorted(g["adapters"])
        doc["families"][fam] = {}
        for m in models:
            bdir = os.path.join(args.bundles, fam, m)
            if not os.path.exists(os.path.join(bdir, "residual.json")):
                sys.exit("families_cuda.py: %s has no residual.json (run bench/gpu/prepare-families.sh where Node is)" % bdir)
            prog = load_bundle(bdir, args.device)
            f32 = [(g["prompts"] if m == "base" else g["adapters"][m]["prompts"])["prompt%d" % p]["greedy_new_ids"] for p in range(len(g["prompt_ids"]))]
            ours = [ours_greedy(prog, ids, args.device, STEPS) for ids in g["prompt_ids"]]
            hf = None
            if not args.no_transformers:
                hf = hf_greedy(os.path.join(args.fixtures, fam), None if m == "base" else os.path.join(args.fixtures, fam, "adapters", m), g["prompt_ids"], args.device, STEPS)
            rows = []
            for p in range(len(ours)):
                row = {"prompt": p, "ours_bf16": ours[p], "golden_f32": f32[p], "ours_vs_f32_first_difference": first_difference(ours[p], f32[p])}
                if hf is not None:
                    row.update(transformers_bf16=hf[p], equal=ours[p] == hf[p], first_difference=first_difference(ours[p], hf[p]))
                    total += 1
                    equal += int(ours[p] == hf[p])
                rows.append(row)
            doc["families"][fam][m] = rows
            def said(r):
                if "equal" in r:
                    return "= transformers bf16" if r["equal"] else "parts from transformers bf16 at %d" % r["first_difference"]
                d = r["ours_vs_f32_first_difference"]
                return "= f32 golden" if d is None else "parts from the f32 golden at %d" % d

            print("%s %s: %s" % (fam, m, "; ".join(said(r) for r in rows)), flush=True)
            del prog
    doc["summary"] = {"sequences": total, "equal_to_transformers_bf16": equal} if not args.no_transformers else {"transformers": "skipped (--no-transformers)"}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(doc["summary"]))


if __name__ == "__main__":
    main()
