"""Builds the StageML torch extension from bench/gpu/out/cuda/<case> (native/build.py), then checks
every torch.ops.stageml op against a float64 reference on fresh random inputs (outputs
NaN-poisoned through the ops' .out overloads) and times it against cuBLAS (torch.matmul, the base
GEMM alone) and the generated Triton kernels of the same case, with triton.testing.do_bench.

    python3 bench/gpu/bench_cuda.py --out sm90.json [--build-dir DIR]
"""
import argparse
import faulthandler
import importlib
import json
import os
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out")
sys.path.insert(0, os.path.join(HERE, "..", "..", "native"))
import build as native_build  # noqa: E402

CASES = {
    "lora_bf16_r16": [1, 16, 64, 128, 256, 1000, 1024, 4096],
    "lora_bf16_r64": [64, 256, 4096],
    "lora_f16_r16": [37, 256, 4096],
    "sgmv_bf16_r8": [1, 16, 64, 256],
    "sgmv_bf16_r16": [1, 16, 37, 64, 256],
    "sgmv_bf16_r64": [1, 16, 64, 256],
    "sgmv_bf16_mixed": [1, 16, 64, 256],
    "bgmv_bf16_r16": [1, 64, 256],
    "moe_bf16_r16": [37, 64, 512, 2048],
}
_LOADED = []


def load_case(case):
    """Imports the case's generated Triton check module (for inputs, reference and the Triton
    launcher), first dropping the previous case's modules, which have the same names."""
    for name in _LOADED:
        sys.modules.pop(name, None)
    _LOADED.clear()
    d = os.path.join(OUT, "triton", case)
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    kernel = manifest["kernels"][0]
    sys.path.insert(0, d)
    try:
        check = importlib.import_module(f"{kernel['name']}_check")
    finally:
        sys.path.remove(d)
    _LOADED.extend([f"{kernel['name']}_check", f"{kernel['name']}_launch", kernel["name"], "stageml_triton_common"])
    return kernel, check


def cuda_runner(kind, check, inp, out):
    """(run, parts) for the CUDA ops of one case: run(out) computes the whole layer into out."""
    ops = torch.ops.stageml
    launch = check.launch
    if kind == "loraLinear":
        def run(mode=0):
            return ops.lora_linear.out(inp["x"], inp["w"], inp["a"], inp["b"], check.SCALE, inp["bias"], mode, out=out)
        nbytes, flops = check.traffic(inp)
        return run, [("fused", lambda: run(1), lambda: check.run(inp, out, "fused"), nbytes, flops),
                     ("pair", lambda: run(2), lambda: check.run(inp, out, "pair"), nbytes, flops)]
    if kind in ("bankGrouped", "bankGathered"):
        common = check.common
        bank = inp["bank"]
        meta = common.make_row_meta(inp["group"], bank.num_adapters, 16)
        split = launch.split_k_for(meta)
        rows = (meta.order, meta.group, meta.row0, meta.nrows)

        def shrink():
            return ops.lora_shrink(inp["x"], bank.a, bank.offset, bank.rank, *rows, 16, bank.max_rank, split)

        def run():
            y = ops.linear.out(inp["x"], inp["w"], None, out=out)
            ops.lora_expand(y, shrink(), bank.b, bank.offset, bank.rank, bank.scale, *rows, 16, bank.max_rank)
            return y

        t = shrink()
        y = torch.zeros_like(out)
        tt = launch.shrink(inp["x"], bank, inp["meta"], split)
        (sb, sf), (eb, ef), _ = check.lora_traffic(inp)
        return run, [("shrink", shrink, lambda: launch.shrink(inp["x"], bank, inp["meta"], split), sb, sf),
                     ("expand", lambda: ops.lora_expand(y, t, bank.b, bank.offset, bank.rank, bank.scale, *rows, 16, bank.max_rank),
                      lambda: launch.expand(y, tt, bank, inp["meta"]), eb, ef)]
    if kind == "moeLora":
        meta = check.common.make_row_meta(inp["experts"], check.E, 64)
        rows = (meta.order, meta.group, meta.row0, meta.nrows)

        def run():
            return ops.residual_moe.out(inp["x"], inp["w"], inp.get("a"), inp.get("b"), check.SCALE, *rows, 64, out=out)

        return run, []
    raise ValueError(kind)


def bench_case(case, rows_list, peak):
    kernel, check = load_case(case)
    common = check.common
    bound = common.ERROR_BOUNDS[kernel["dtype"]]
    results = []
    for m in rows_list:
        worst = 0.0
        for trial in range(2):
            inp = check.make_inputs(m, 5000 + 1000 * m + trial, "cuda")
            out = torch.full((check.rows_of(inp), check.N), float("nan"), device="cuda", dtype=check.DTYPE)
            run, _ = cuda_runner(kernel["kind"], check, inp, out)
            print(f"  {case} rows={m} trial {trial}: running", flush=True)
            got = run()
            torch.cuda.synchronize()
            worst = max(worst, common.rel_error(got.reshape(-1, check.N), check.reference(inp)))
        inp = check.make_inputs(m, 7, "cuda")
        out = torch.empty((check.rows_of(inp), check.N), device="cuda", dtype=check.DTYPE)
        nbytes, flops = check.traffic(inp)
        # Rotating operand sets for the CUDA-graph timings (no launch overhead, no L2 reuse).
        sets = [(inp, out)] + [(check.make_inputs(m, 8 + i, "cuda"), torch.empty_like(out)) for i in range(common.rotation_sets(nbytes) - 1)]
        runners = [cuda_runner(kernel["kind"], check, si, so) for si, so in sets]
        run, parts = runners[0]
        entries = [("run", run, lambda: check.run(inp, out), nbytes, flops,
                    [r[0] for r in runners], [lambda s=s: check.run(*s) for s in sets])]
        entries += [(p[0], p[1], p[2], p[3], p[4], [r[1][j][1] for r in runners], [r[1][j][2] for r in runners]) for j, p in enumerate(parts)]
        cublas = common.bench_ms(lambda: check.cublas(inp))
        cublas_graph = common.bench_graph_ms([lambda s=s: check.cublas(s[0]) for s in sets])
        for label, fn, tri, b, f, fns, tris in entries:
            ms = common.bench_ms(fn)
            tms = common.bench_ms(tri)
            gms = common.bench_graph_ms(fns)
            tgms = common.bench_graph_ms(tris)
            gbps = b / (ms * 1e-3) / 1e9
            ggbps = b / (gms * 1e-3) / 1e9
            same = common.copy_gbps(b)
            results.append({"case": case, "kernel": kernel["name"], "kind": kernel["kind"], "dtype": kernel["dtype"], "rows": m, "part": label,
                            "rel_error": worst, "bound": bound, "ok": worst <= bound, "time_ms": ms, "triton_ms": tms,
                            "graph_ms": gms, "triton_graph_ms": tgms, "cublas_base_ms": cublas, "cublas_base_graph_ms": cublas_graph,
                            "vs_cublas_base": ms / cublas, "graph_vs_cublas_base": gms / cublas_graph, "vs_triton": ms / tms,
                            "graph_vs_triton": gms / tgms, "gbps": gbps, "graph_gbps": ggbps, "tflops": f / (ms * 1e-3) / 1e12,
                            "graph_tflops": f / (gms * 1e-3) / 1e12, "copy_gbps_same_size": same, "copy_frac_same_size": gbps / same,
                            "graph_copy_frac": ggbps / peak, "copy_frac_peak": gbps / peak, "l2_resident": len(sets) * b < 150e6})
        print(f"{case} rows={m}: err {worst:.2e} ({'ok' if worst <= bound else 'FAIL'}), "
              f"cuda {results[-len(entries)]['graph_ms']:.4f} ms, triton {results[-len(entries)]['triton_graph_ms']:.4f} ms, "
              f"cublas {cublas_graph:.4f} ms (graph timings)",
              flush=True)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--build-dir", default=None)
    ap.add_argument("--cases", default=None)
    args = ap.parse_args()
    cases = args.cases.split(",") if args.cases else list(CASES)
    faulthandler.enable()
    start = time.time()
    lib = native_build.load([os.path.join(OUT, "cuda", c) for c in CASES], args.build_dir, verbose=False)
    print(f"extension built and loaded in {time.time() - start:.0f} s: {lib}", flush=True)
    registered = native_build.kernels(lib)
    print(f"{len(registered)} generated kernels registered", flush=True)
    payload = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "kernels": registered}, "results": [], "failures": []}
    peak = None
    for case in cases:
        try:
            if peak is None:
                peak = load_case(case)[1].common.copy_gbps(2 << 30)
                payload["meta"]["copy_gbps_peak"] = peak
            payload["results"] += bench_case(case, CASES[case], peak)
        except Exception as e:  # one broken case must not hide the others' results
            traceback.print_exc()
            payload["failures"].append({"case": case, "error": f"{type(e).__name__}: {e}"})
        with open(args.out, "w") as f:
            json.dump(payload, f, indent=2)
    return 0 if not payload["failures"] and all(r["ok"] for r in payload["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
