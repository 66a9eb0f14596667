"""Merges the device run's e2e.json and decode8b.json into bench/results/gpu-e2e.{json,md}.

    python3 bench/gpu/report-e2e.py E2E_JSON DECODE_JSON --out-dir bench/results
"""
import argparse
import json
import os


def fmt(x, spec="%.2f"):
    return "-" if x is None else spec % x


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("e2e")
    ap.add_argument("decode")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--unfused", default=None, help="e2e.py's JSON from a run with STAGEML_TORCH_FUSE=0 (same device session)")
    ap.add_argument("--worker", default=None, help="worker_smoke.py's JSON (the worker process on CUDA over the protocol)")
    args = ap.parse_args()
    e2e = json.load(open(args.e2e))
    dec = json.load(open(args.decode))
    merged = {"suite": "gpu-e2e", "machine": dec["meta"]["device"], "e2e": e2e, "decode8b": dec}
    if args.worker:
        merged["worker"] = json.load(open(args.worker))
    if args.unfused:
        merged["e2e_unfused"] = json.load(open(args.unfused))
    with open(os.path.join(args.out_dir, "gpu-e2e.json"), "w") as f:
        json.dump(merged, f, indent=1)

    m = dec["meta"]
    L = []
    L.append("# GPU end to end (torch executor worker) on an %s" % m["device"])
    L.append("")
    L.append("Run %s (the decode bench; the e2e and worker tables come from later calls of the same device session); torch %s, transformers %s, "
             "peft %s. Scripts: bench/gpu/device-e2e.sh; inputs prepared by bench/gpu/prepare-e2e.ts on the CPU machine (Node is not on the "
             "GPU machine)." % (m["date"], m["torch"], m["transformers"], m["peft"]))
    L.append("")
    L.append("## Whole model on the GPU: our residual against transformers + PEFT (bf16, same GPU)")
    L.append("")
    L.append("Ours = the residual bundle (`stageml stage --dtype bf16`) run by `stageml_torch.Program` (the torch executor's worker) "
             "on CUDA, greedy decode with the KV cache through the residual's `past_*`/`present_*`. HF = transformers + PEFT in bf16 "
             "with the same (bf16-rounded) weights and adapter factors. f32 = the same HF model cast to f32 (reference). "
             "rel = ‖logits − ref‖/‖ref‖ over the prefill logits.")
    L.append("")
    L.append("| case | prompt tokens | greedy ours = HF bf16 | first differing step | ours tokens = f32 greedy | HF bf16 tokens = f32 greedy | ours vs f32 rel | HF bf16 vs f32 rel | ours vs HF bf16 rel |")
    L.append("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in e2e["results"]:
        if "error" in r:
            L.append("| %s | error: %s | | | | | | | |" % (r["case"], r["error"]))
            continue
        n = len(r["rows"][0]["ours"])
        for x in r["rows"]:
            L.append("| %s | %d | %s | %s | %d of %d | %d of %d | %.2e | %.2e | %.2e |" % (
                r["case"], x["prompt_len"], "yes" if x["equal"] else "no", "-" if x["first_mismatch"] is None else str(x["first_mismatch"]),
                x["ours_equal_f32_prefix"], n, x["hf_bf16_equal_f32_prefix"], n, x["ours_vs_f32_rel"], x["hf_bf16_vs_f32_rel"], x["ours_vs_hf_bf16_logits_rel"]))
    L.append("")
    L.append("fixture = fixtures/peft-tiny/llama with adapter all-r16 (12 new tokens); big8 = 8 layers, hidden 4096, intermediate 14336, "
             "GQA 32/8, vocab 32000, random bf16 weights drawn on the GPU, r16 adapter (random A and B) on all seven projections "
             "(16 new tokens). 'tokens = f32 greedy' counts the leading tokens equal to the f32 model's greedy continuation.")
    L.append("")
    if args.unfused:
        u = json.load(open(args.unfused))
        L.append("The table is with LoRA linears fused (the executor's default on CUDA: one split-K Triton launch per LoRA linear, "
                 "f32 accumulation, one rounding; fixture shapes are too small for the kernel and take the torch path). "
                 "Unfused (`STAGEML_TORCH_FUSE=0`, each op rounded to bf16, an earlier call of the same session):")
        L.append("")
        L.append("| case | prompt tokens | ours vs f32 rel, unfused | fused | tokens = f32 greedy, unfused | fused | ours s (prefill + decode), unfused | fused | HF s |")
        L.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for ru, rf in zip(u["results"], e2e["results"]):
            for xu, xf in zip(ru.get("rows", []), rf.get("rows", [])):
                L.append("| %s | %d | %.2e | %.2e | %d | %d | %.2f | %.2f | %.2f |" % (rf["case"], xf["prompt_len"], xu["ours_vs_f32_rel"], xf["ours_vs_f32_rel"],
                         xu["ours_equal_f32_prefix"], xf["ours_equal_f32_prefix"], xu["ours_s"], xf["ours_s"], xf["hf_s"]))
        L.append("")
        L.append("Seconds are wall time of the Python loop (prompts in order; the first calls of each shape include CUDA/Triton compilation: "
                 "the fused big8 rows compile the kernel's two row tiles on prompts 1 and 2; prompt 3 is the steady state). "
                 "The fused kernel sums K splits with f32 atomics, so its last bits can differ between runs.")
        L.append("")
    if args.worker:
        w = json.load(open(args.worker))
        L.append("The worker process itself on CUDA, driven over the stdio protocol as the TS executor drives it (bench/gpu/worker_smoke.py, "
                 "fixture-bf16, separate device call): hello reports `%s` on `%s`; prepare %.2f s; the prefill's logits equal in-process "
                 "`Program.run` exactly (max |Δ| %.1g); a bad handle is `%s`; dispose and shutdown answer ok, exit code %d. A decode step's "
                 "round trip over the protocol (KV cache in and out as host tensors, as the engine passes it today) took %.1f ms median "
                 "for this 2-layer model, far above the in-process steps of the runs above (about 8 ms once their lengths had been seen); not profiled yet, likely first-use cost per new KV length (each step's is new here); a static device-resident KV cache with CUDA graphs is the planned fix." % (
                     w["hello"]["torch"], w["hello"]["deviceName"], w["prepare_s"], w["logits_max_abs_diff_vs_in_process"], w["bad_handle"]["code"], w["exit_code"], w["decode_step_roundtrip_ms_median"]))
        L.append("")
    L.append("## Llama-3-8B-shaped decode step, 64 adapters on all projections")
    L.append("")
    L.append("%s. Context %d positions (KV cache), batch b = b streams on b different adapters. Ours: the decode step as torch ops "
             "(cuBLAS base GEMMs, SDPA, HF-exact norms and rotary) plus the generated SGMV shrink/expand kernels per projection "
             "(`stageml gen triton` of a 64-adapter bank), one CUDA graph, median of replays. Base = the same step without adapters. "
             "Byte floor = 1 + (adapter factor bytes the batch's adapters read) / (base weight bytes, %.1f GB), KV excluded." % (
                 m["model"], m["context"], m["base_weight_bytes"] / 1e9))
    L.append("")
    L.append("| ranks (64 adapters) | batch | base ms | base tok/s | 64-adapter ms | 64-adapter tok/s | × base | byte floor × base |")
    L.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in dec["steps"]:
        L.append("| %s | %d | %.2f | %.0f | %.2f | %.0f | %.2f | %.2f |" % ("8/16/64 cycled" if r["mix"] == "mixed" else "all 8", r["batch"], r["base_ms"], r["base_tok_s"], r["lora_ms"], r["lora_tok_s"], r["lora_over_base"], r["byte_floor_ratio"]))
    L.append("")
    L.append("PEFT's mixed batch (`adapter_names`, eager, same model and adapters, KV cache of %d):" % m["context"])
    L.append("")
    L.append("| batch | PEFT mixed ms | HF base eager ms | PEFT mixed ÷ ours (64-adapter step) |")
    L.append("| ---: | ---: | ---: | ---: |")
    for r in dec["peft"]:
        L.append("| %d | %.1f | %.1f | %s |" % (r["batch"], r["peft_mixed_ms"], r["hf_base_eager_ms"], fmt(r.get("peft_over_ours"), "%.0f×")))
    L.append("")
    c = dec["checks"].get("mixed", {})
    if c:
        L.append("Check (one step at position 0, 64 rows on 64 adapters): ours vs PEFT mixed batch rel %.2e, argmax agreement %.0f%% "
                 "(the adapters move the logits by %.0f%%); base-only step vs HF base: rel %.1e, argmax agreement %.0f%%." % (
                     c["ours_vs_peft_rel"], 100 * c["argmax_agree"], 100 * c["adapter_effect_rel"], c["ours_base_vs_hf_base_rel"], 100 * c["ours_base_argmax_agree"]))
    L.append("")
    L.append("## Against the targets")
    L.append("")
    s64 = next((r for r in dec["steps"] if r["mix"] == "mixed" and r["batch"] == 64), None)
    r8 = next((r for r in dec["steps"] if r["mix"] == "r8" and r["batch"] == 64), None)
    p64 = next((r for r in dec["peft"] if r["batch"] == 64), None)
    if s64 and r8 and p64:
        L.append("- 64 streams on 64 adapters ≤ 1.3× the base step: **missed** — %.2f× (ranks 8/16/64) and %.2f× (all r8). With these ranks "
                 "the adapters' factors are %.0f%% (%.0f%%) of the base weights' bytes, so no kernel that reads them once per step can go "
                 "under %.2f× (%.2f×); we are %.0f%% (%.0f%%) over that floor. ≤ 1.3× holds up to 4 streams." % (
                     s64["lora_over_base"], r8["lora_over_base"], 100 * (s64["byte_floor_ratio"] - 1), 100 * (r8["byte_floor_ratio"] - 1),
                     s64["byte_floor_ratio"], r8["byte_floor_ratio"], 100 * (s64["lora_over_base"] / s64["byte_floor_ratio"] - 1), 100 * (r8["lora_over_base"] / r8["byte_floor_ratio"] - 1)))
        L.append("- ≥ 20× PEFT's mixed batch in the same run: **holds** — %.0f× at 64 streams (PEFT loops over adapters per module, eagerly)." % p64["peft_over_ours"])
    rows = [(r["case"], x) for r in e2e["results"] if "rows" in r for x in r["rows"]]
    def left(case, key):
        xs = [x for c, x in rows if c == case]
        return sum(1 for x in xs if x[key] < len(x["ours"])), len(xs)
    fo, fn = left("fixture", "ours_equal_f32_prefix")
    fh, _ = left("fixture", "hf_bf16_equal_f32_prefix")
    bo, bn = left("big8", "ours_equal_f32_prefix")
    bh, _ = left("big8", "hf_bf16_equal_f32_prefix")
    eq_f = sum(1 for c, x in rows if c == "fixture" and x["equal"])
    eq_b = sum(1 for c, x in rows if c == "big8" and x["equal"])
    L.append("- Greedy tokens equal to transformers + PEFT: **holds on %d of %d fixture prompts and %d of %d big8 prompts only**. "
             "Neither side is the outlier: HF's own bf16 run leaves the f32 model's greedy path on %d of %d fixture and %d of %d big8 prompts, "
             "ours on %d of %d and %d of %d (random-weight models have near-ties that bf16 rounding flips, then the continuations part). "
             "Logits within bf16 tolerance of f32: ours ≤ %.1e (fixture) and ≤ %.1e (big8), HF bf16 ≤ %.1e and ≤ %.1e (unfused, ours rounds "
             "the LoRA chain to bf16 op by op as the IR specifies and lands 5-15%% further than PEFT, which keeps it in f32; the fused kernel "
             "accumulates in f32 and lands level with or under HF)." % (
                 eq_f, fn, eq_b, bn, fh, fn, bh, bn, fo, fn, bo, bn,
                 max(x["ours_vs_f32_rel"] for c, x in rows if c == "fixture"), max(x["ours_vs_f32_rel"] for c, x in rows if c == "big8"),
                 max(x["hf_bf16_vs_f32_rel"] for c, x in rows if c == "fixture"), max(x["hf_bf16_vs_f32_rel"] for c, x in rows if c == "big8")))
    L.append("")
    with open(os.path.join(args.out_dir, "gpu-e2e.md"), "w") as f:
        f.write("\n".join(L))


if __name__ == "__main__":
    main()
