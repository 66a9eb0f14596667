"""Renders bench/results/{triton,sm90}.md from the JSON the device run wrote.

    python3 bench/gpu/report.py triton.json sm90.json --out-dir DIR
"""
import argparse
import json
import os
import sys


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(rows, cols):
    head = "| " + " | ".join(c for c, _, _ in cols) + " |"
    sep = "| " + " | ".join("---:" if align == "r" else "---" for _, _, align in cols) + " |"
    body = ["| " + " | ".join(f(r) for _, f, _ in cols) + " |" for r in rows]
    return "\n".join([head, sep] + body)


def triton_md(data):
    meta = data["meta"] or {}
    rows = [r for r in data["results"] if r.get("part") != "check"]
    checks = data["results"]
    out = [f"# Triton kernels (@stageml/triton-gen) on {meta.get('gpu')}", "",
           f"Run {meta.get('date')}; torch {meta.get('torch')}, triton {meta.get('triton')}. Measured device-to-device copy: "
           f"{fmt(meta.get('copy_gbps_peak'), '.0f')} GB/s (bytes read + written, 2 GiB); empty-kernel launch floor "
           f"{fmt((meta.get('launch_floor_ms') or 0) * 1e3, '.1f')} µs. Times are do_bench medians (L2 flushed between runs).", "",
           "`do_bench ms`: triton.testing.do_bench median, L2 flushed before each call, Python launch overhead included "
           "(decisive for calls of a few microseconds). `graph ms`: time per call replayed back to back from one CUDA graph over "
           "rotating operand sets about 3x the L2 (no launch overhead, no L2 reuse; `(L2)` marks sets too small to leave the L2). "
           "`vs cuBLAS` = time / torch.matmul time of the base GEMM alone, timed the same way; `vs eager` = time / PEFT-style torch "
           "eager; `graph / copy` = achieved GB/s (fewest bytes: operands read once, outputs written once) over the measured "
           "device-to-device copy bandwidth.", "",
           ]
    for run in meta.get("runs", []):
        out.append(f"- run {run['date']}: {run['cases']}")
    out += ["", "## Correctness (‖out − ref‖/‖ref‖ against float64, fresh inputs, NaN-poisoned outputs)", ""]
    seen = {}
    for r in checks:
        key = (r["case"], r["rows"])
        seen[key] = max(seen.get(key, 0.0), r["rel_error"]) if r["ok"] else float("inf") if key not in seen else seen[key]
    ok = sum(1 for r in checks if r["ok"])
    out.append(f"{ok} of {len(checks)} result rows within their dtype's bound (f16 2e-3, bf16 1e-2, f32 as 3xTF32 1e-4); worst per case:")
    out.append("")
    worst = {}
    for r in checks:
        worst[r["case"]] = max(worst.get(r["case"], 0.0), r["rel_error"])
    out.append(table(sorted(worst.items()), [("case", lambda x: x[0], "l"), ("worst rel. error", lambda x: fmt(x[1], ".2e"), "r")]))
    out += ["", "## Timing", ""]
    cols = [("case", lambda r: r["case"], "l"), ("rows", lambda r: str(r["rows"]), "r"), ("part", lambda r: r["part"], "l"),
            ("do_bench ms", lambda r: fmt(r.get("time_ms"), ".4f"), "r"), ("vs cuBLAS", lambda r: fmt(r.get("vs_cublas_base"), ".2f"), "r"),
            ("vs eager", lambda r: fmt(r.get("vs_eager"), ".2f"), "r"), ("graph ms", lambda r: fmt(r.get("graph_ms"), ".4f"), "r"),
            ("graph GB/s", lambda r: fmt(r.get("graph_gbps"), ".0f"), "r"), ("graph TFLOP/s", lambda r: fmt(r.get("graph_tflops"), ".1f"), "r"),
            ("graph / copy", lambda r: fmt(r.get("graph_copy_frac"), ".2f") + (" (L2)" if r.get("l2_resident") else ""), "r"),
            ("graph vs cuBLAS", lambda r: fmt(r.get("graph_vs_cublas_base"), ".2f"), "r")]
    out.append(table(rows, cols))
    out += ["", "## Targets (CUDA-graph timings)", ""] + targets(rows, meta)
    if data.get("failures"):
        out += ["", "## Failures", ""] + [f"- {f.get('case')}: {f.get('kernel', '')} {f['error']}" for f in data["failures"]]
    return "\n".join(out) + "\n"


def targets(rows, meta):
    """Fused base + LoRA <= 1.10x cuBLAS's base GEMM at batch >= 64; grouped shrink/expand >= 75% of
    the copy bandwidth where memory-bound: their bytes take at least twice the in-graph launch
    floor (the fastest grouped call measured) at copy bandwidth, and the rotating sets leave the L2."""
    lines = ["Fused base + LoRA (target: time <= 1.10x the cuBLAS time of the base GEMM, batch >= 64):", ""]
    fused = [r for r in rows if r["kind"] == "loraLinear" and r["part"] == "run" and r["rows"] >= 64 and r.get("graph_vs_cublas_base")]
    lines.append(table(fused, [("case", lambda r: r["case"], "l"), ("rows", lambda r: str(r["rows"]), "r"),
                               ("x cuBLAS", lambda r: fmt(r["graph_vs_cublas_base"], ".2f"), "r"),
                               ("met", lambda r: "yes" if r["graph_vs_cublas_base"] <= 1.10 else f"no (+{(r['graph_vs_cublas_base'] / 1.10 - 1) * 100:.0f}%)", "l")]))
    peak = meta.get("copy_gbps_peak") or 1
    grouped = [r for r in rows if r["part"] in ("shrink", "expand")]
    floor = min((r["graph_ms"] for r in grouped), default=0.0) * 1e-3
    for r in grouped:
        byte_floor = r["graph_gbps"] * r["graph_ms"] * 1e-3 / peak  # seconds at copy bandwidth
        r["_memory_bound"] = byte_floor >= 2 * floor and not r.get("l2_resident")
    lines += ["", f"In-graph launch floor (fastest grouped call): {floor * 1e6:.1f} µs; memory-bound here means the call's bytes "
              f"take at least {2 * floor * 1e6:.1f} µs at the copy bandwidth ({2 * floor * peak * 1e3:.0f} MB)."]
    lines += ["", "Grouped shrink/expand, d=4096, 64 adapters (target: >= 0.75 of copy bandwidth where memory-bound):", ""]
    lines.append(table(grouped, [("case", lambda r: r["case"], "l"), ("rows", lambda r: str(r["rows"]), "r"), ("part", lambda r: r["part"], "l"),
                                 ("GB/s", lambda r: fmt(r["graph_gbps"], ".0f"), "r"), ("/ copy", lambda r: fmt(r["graph_copy_frac"], ".2f"), "r"),
                                 ("regime", lambda r: "memory-bound" if r["_memory_bound"] else "latency-bound", "l"),
                                 ("met", lambda r: "-" if not r["_memory_bound"] else "yes" if r["graph_copy_frac"] >= 0.75 else f"no (-{(1 - r['graph_copy_frac'] / 0.75) * 100:.0f}%)", "l")]))
    return lines


def sm90_md(data):
    meta = data["meta"] or {}
    out = [f"# CUDA sm_90a kernels (@stageml/sm90-native, native/) on {meta.get('gpu')}", "",
           f"Run {meta.get('date')}; torch {meta.get('torch')}; copy peak {fmt(meta.get('copy_gbps_peak'), '.0f')} GB/s. Each op of torch.ops.stageml checked "
           "against float64 (fresh inputs, outputs NaN-poisoned through the .out overloads) and timed with do_bench (median) against "
           "cuBLAS (base GEMM alone) and the generated Triton kernels of the same case. `graph` columns: time per call replayed from one "
           "CUDA graph over rotating operand sets about 3x the L2 (no launch overhead, no L2 reuse); ratios compare graph timings.", ""]
    cols = [("case", lambda r: r["case"], "l"), ("rows", lambda r: str(r["rows"]), "r"), ("part", lambda r: r["part"], "l"),
            ("rel. error", lambda r: fmt(r["rel_error"], ".2e"), "r"), ("ok", lambda r: "yes" if r["ok"] else "NO", "l"),
            ("do_bench ms", lambda r: fmt(r["time_ms"], ".4f"), "r"), ("graph ms", lambda r: fmt(r.get("graph_ms"), ".4f"), "r"),
            ("Triton graph ms", lambda r: fmt(r.get("triton_graph_ms"), ".4f"), "r"),
            ("cuBLAS graph ms", lambda r: fmt(r.get("cublas_base_graph_ms"), ".4f"), "r"),
            ("vs cuBLAS", lambda r: fmt(r.get("graph_vs_cublas_base"), ".2f"), "r"), ("vs Triton", lambda r: fmt(r.get("graph_vs_triton"), ".2f"), "r"),
            ("graph GB/s", lambda r: fmt(r.get("graph_gbps"), ".0f"), "r"), ("graph TFLOP/s", lambda r: fmt(r.get("graph_tflops"), ".1f"), "r"),
            ("graph / copy", lambda r: fmt(r.get("graph_copy_frac"), ".2f") + (" (L2)" if r.get("l2_resident") else ""), "r")]
    out.append(table(data["results"], cols))
    if data.get("failures"):
        out += ["", "## Failures", ""] + [f"- {f['case']}: {f['error']}" for f in data["failures"]]
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("triton_json")
    ap.add_argument("sm90_json")
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    for path, render, name in ((args.triton_json, triton_md, "triton.md"), (args.sm90_json, sm90_md, "sm90.md")):
        if os.path.exists(path):
            with open(path) as f:
                text = render(json.load(f))
            with open(os.path.join(args.out_dir, name), "w") as f:
                f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
