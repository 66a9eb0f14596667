"""Runs every generated Triton check-and-bench script of bench/gpu/out/triton/<case> (each case in
its own process: the generated modules of different cases share names) and merges the results.

    python3 bench/gpu/run_triton.py --out triton.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "out", "triton")
# Row counts per case (None: the kernel's own check and bench rows).
ROWS = {
    "lora_bf16_r16": None,
    "lora_bf16_r64": "64,256,1024,4096",
    "lora_f16_r16": "37,256,4096",
    "lora_f32_r16": "37,256,4096",
    "sgmv_bf16_r8": None,
    "sgmv_bf16_r16": None,
    "sgmv_bf16_r64": None,
    "sgmv_bf16_mixed": None,
    "bgmv_bf16_r16": None,
    "moe_bf16_r16": None,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=None)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    args = ap.parse_args()
    cases = args.cases.split(",") if args.cases else list(ROWS)
    merged = {"meta": None, "results": [], "failures": []}
    for case in cases:
        start = time.time()
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            path = tmp.name
        cmd = [sys.executable, os.path.join(ROOT, case, "check_all.py"), "--json", path]
        if ROWS.get(case):
            cmd += ["--rows", ROWS[case]]
        print(f"== {case}", flush=True)
        try:
            proc = subprocess.run(cmd, cwd=os.path.join(ROOT, case), timeout=args.timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        try:
            with open(path) as f:
                data = json.load(f)
            merged["meta"] = merged["meta"] or data["meta"]
            merged["results"] += [dict(r, case=case) for r in data["results"]]
            merged["failures"] += [dict(x, case=case) for x in data["failures"]]
        except (OSError, ValueError) as e:
            merged["failures"].append({"case": case, "error": f"no results (exit {rc}): {e}"})
        print(f"== {case}: exit {rc} in {time.time() - start:.0f} s", flush=True)
        with open(args.out, "w") as f:
            json.dump(merged, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
