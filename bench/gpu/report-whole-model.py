"""Rewrites the whole-model section of bench/results/gpu-e2e.md from bench/gpu/e2e.py's JSON (the
section between '## Whole model' and the next '## '); the rest of the file is left as it is.

    python3 bench/gpu/report-whole-model.py bench/results/gpu-e2e-whole-model.json --md bench/results/gpu-e2e.md
"""
import argparse
import json

VARIANTS = {
    "f32": "f32 (default: PEFT-exact)",
    "same": "same (fused on CUDA)",
    "f32-hf-cuda-rope": "f32, HF's rope table",
}


def section(d):
    m = d["meta"]
    res = [r for r in d["results"] if "error" not in r]
    L = ["## Whole model on the GPU: our residual against transformers + PEFT (bf16, same GPU)", ""]
    L.append("Run %s on an %s; torch %s, transformers %s, peft %s, `STAGEML_TORCH_FUSE=%s`, TF32 %s. Script: bench/gpu/e2e.py (device-e2e.sh `e2e`), "
             "JSON: bench/results/gpu-e2e-whole-model.json." % (m["date"], m["device"], m["torch"], m["transformers"], m["peft"], m["fuse_mode"],
                                                                 "on" if m["allow_tf32"] else "off"))
    L.append("")
    L.append("Ours = the residual bundle (`stageml stage --dtype bf16 --adapter-dtype f32|same`) run by `stageml_torch.Program` (the torch "
             "executor's worker) on CUDA. HF = transformers + PEFT in bf16 on the same weights (PEFT keeps the adapter factors in f32, its "
             "`autocast_adapter_dtype=True`; for `same` they are rounded to bf16 first so both sides hold the same values). Greedy decode "
             "in lockstep with KV caches on both sides; while the token sequences agree, every step compares each module's output "
             "(embedding, norms, the seven projections with their LoRA term, decoder layers, lm_head, the rotary cos table: HF forward "
             "hooks against the residual's values, `Program.run(keep=…)`) and records the first that differs in any bit. f32 = the same HF "
             "model cast to f32 (reference). rel = ‖logits − ref‖/‖ref‖ over the prefill logits.")
    L.append("")
    L.append("| case | variant | LoRA linears fused | prompt tokens | greedy ours = HF bf16 | first differing step | first differing module (step) | "
             "ours tokens = f32 greedy | HF bf16 tokens = f32 greedy | ours vs f32 rel | HF bf16 vs f32 rel | ours vs HF bf16 rel | ours s | HF s |")
    L.append("| --- | --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in res:
        n = len(r["rows"][0]["ours"])
        for x in r["rows"]:
            fd = x["first_differing_module"]
            fds = "none (all %d bit-equal at every step)" % x["prefill_modules"]["compared"] if fd is None else "%s (%d)" % (fd["module"], fd["step"])
            L.append("| %s | %s | %d | %d | %s | %s | %s | %d of %d | %d of %d | %.2e | %.2e | %.2e | %.2f | %.2f |" % (
                r["case"], VARIANTS.get(r["variant"], r["variant"]), r["fused_lora_linears"], x["prompt_len"], "yes" if x["equal"] else "no",
                "-" if x["first_mismatch"] is None else str(x["first_mismatch"]), fds, x["ours_equal_f32_prefix"], n, x["hf_bf16_equal_f32_prefix"], n,
                x["ours_vs_f32_rel"], x["hf_bf16_vs_f32_rel"], x["ours_vs_hf_bf16_logits_rel"], x["ours_s"], x["hf_s"]))
    L.append("")
    L.append("fixture = fixtures/peft-tiny/llama with adapter all-r16 (12 new tokens); big8 = 8 layers, hidden 4096, intermediate 14336, GQA "
             "32/8, vocab 32000, random bf16 weights drawn on the GPU, r16 adapter (random f32 A and B, as PEFT draws them) on all seven "
             "projections (16 new tokens). Seconds: the Python loop per prompt with the diagnostics on (kept values, hooks, comparisons); the "
             "first prompt of each variant includes first-use (and, fused, Triton compile) costs.")
    L.append("")
    big = {r["variant"]: r for r in res if r["case"] == "big8"}
    fix = {r["variant"]: r for r in res if r["case"] == "fixture"}
    rope = big.get("f32", {}).get("rope_inv_freq", {})
    L.append("**What differed, and why.**")
    L.append("")
    L.append("- PEFT-exact (`--adapter-dtype f32`, the default): on the fixture every module output equals HF's bit for bit at every step of "
             "every prompt, so greedy tokens are equal on 4 of 4 prompts and the logits are identical (rel 0). The LoRA term is computed "
             "with PEFT's casts (x cast to f32, f32 A, B and scale, added to the bf16 base output in f32, rounded once), norms and rotary "
             "with transformers' rounding points, attention through the same SDPA call transformers makes (no mask, `is_causal` for the "
             "prompt, `enable_gqa`).")
    if rope:
        L.append("- big8, f32: equal to HF bit for bit as well — all %d module outputs at every step, greedy tokens equal on %d of 3 "
                 "prompts, logits rel 0 — with HF's rotary `inv_freq` buffer in f32 as `from_pretrained(dtype=bf16)` builds it. The "
                 "harness builds big8 with `LlamaForCausalLM(cfg).to(torch.bfloat16)`, which also casts that buffer to bf16 (%d of %d "
                 "values differ from ours, max |Δ| %.3g: exactly the bf16 rounding of our f32 table); the harness registers the f32 "
                 "table anew before each variant (an earlier run that copied it into the bf16 buffer re-rounded it, and there the rotary "
                 "table was the first differing value). Row 'f32, HF's rope table': both sides given that bf16-rounded table instead — "
                 "bit-equal too."
                 % (big["f32"]["rows"][0]["prefill_modules"]["compared"], sum(1 for x in big["f32"]["rows"] if x.get("equal")), rope["ours_vs_hf_cuda_differing"], rope["n"], rope["ours_vs_hf_cuda_max_abs"]))
    L.append("- `--adapter-dtype same` (bf16 factors; on CUDA each LoRA linear runs as the fused split-K kernel, f32 accumulation, one "
             "rounding): the first differing module is layer 0's q_proj at step 0 on every prompt (its LoRA term is rounded differently), "
             "and greedy tokens part on some prompts (fixture, whose shapes are too small for the kernel and take the torch path: %d of 4; "
             "big8: %d of 3)."
             % (sum(1 for x in fix.get("same", {}).get("rows", []) if x.get("equal")), sum(1 for x in big.get("same", {}).get("rows", []) if x.get("equal"))) + " Its logits stay within bf16 error of f32 and land closer to f32 than HF's on big8.")
    if "f32" in big:
        prefixes = ", ".join(str(x["hf_bf16_equal_f32_prefix"]) for x in big["f32"]["rows"])
        L.append("- Random-weight models have near-ties: HF's own bf16 run follows the f32 model's greedy path for only %s of 16 tokens "
                 "on big8, so token equality with f32 is not the measure; bit equality with HF bf16 is, and holds." % prefixes)
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("json")
    ap.add_argument("--md", required=True)
    args = ap.parse_args()
    d = json.load(open(args.json))
    text = open(args.md).read()
    start = text.index("## Whole model")
    end = text.index("\n## ", start + 3) + 1
    # Paragraphs of the old section kept: the worker process smoke test (a separate device call).
    keep = [p for p in text[start:end].split("\n\n") if p.startswith("The worker process itself on CUDA")]
    body = section(d) + ("\n" + "\n\n".join(keep) + "\n" if keep else "")
    with open(args.md, "w") as f:
        f.write(text[:start] + body + "\n" + text[end:])


if __name__ == "__main__":
    main()
