"""Markdown tables from bench/gpu/bankx.py and decode8b.py --kernel stream runs (no GPU needed).

    python3 bench/gpu/report-bankx.py RUN_DIR [RUN_DIR ...] > tables.md

Each RUN_DIR holds bankx.json and/or decode.json from one device call; a table gets one row per
(case, rows) per call: µs and × cuBLAS base of every variant, and the decode steps (ms, tok/s,
× base for the built-in table and every --bank-tables table)."""
import json
import os
import sys


def short(name):
    return (name.replace("sx ('sx', 32, 128, ", "EV(").replace(") B^T", ") Bᵀ").replace("shipped dispatch, ", "shipped: ")
            .replace("b_bank + b_bank_t", "b + bᵀ").replace("b_bank", "b"))


def bank_tables(runs):
    out = []
    names = []
    for _, d in runs:
        for r in d.get("rows", []):
            for k in r["variants"]:
                if k not in names and "alone" not in k and k != "cublas_base":
                    names.append(k)
    out.append("| case | rows | N × K | call | cuBLAS base µs | " + " | ".join(short(n) for n in names) + " |")
    out.append("| --- | ---: | --- | --- | ---: | " + " | ".join("---:" for _ in names) + " |")
    for label, d in runs:
        for r in d.get("rows", []):
            cells = []
            for n in names:
                v = r["variants"].get(n)
                cells.append("-" if v is None else ("%.3f" % v["x_base"] if "x_base" in v else "wrong" if "error" in v else "-"))
            out.append("| %s | %d | %d × %d | %s | %.2f | %s |" % (r["case"].replace("bank64_", ""), r["rows"], r["N"], r["K"], label, r["cublas_base_us"], " | ".join(cells)))
    alone = []
    for label, d in runs:
        for r in d.get("rows", []):
            for k, v in r["variants"].items():
                if "alone" in k:
                    gbps = v.get("B_GBps", v.get("A_GBps"))
                    alone.append("| %s | %d | %s | %s | %.2f | %.0f |" % (r["case"].replace("bank64_", ""), r["rows"], label, k, v["us"], gbps))
    if alone:
        out += ["", "| case | rows | call | kernel alone | µs | GB/s of factor rows |", "| --- | ---: | --- | --- | ---: | ---: |"] + alone
    return out


def decode_tables(runs):
    out = []
    for label, d in runs:
        if "steps" not in d:
            continue
        tabs = [t for t in d["meta"].get("bank_tables", {}) if t != "default"]
        out.append("")
        out.append("Call %s (%s; built-in table %s%s):" % (label, d["meta"]["date"], json.dumps(d["meta"].get("bank_tables", {}).get("default", d["meta"].get("bank_table"))),
                                                         "; also " + ", ".join("%s %s" % (t, json.dumps(d["meta"]["bank_tables"][t])) for t in tabs) if tabs else ""))
        out.append("")
        out.append("| mix | streams | base ms | base tok/s | 64-adapter ms | tok/s | × base | " + " | ".join("%s × base" % t for t in tabs) + " | byte floor |")
        out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in tabs) + " | ---: |")
        for s in d["steps"]:
            extra = " | ".join("%.3f" % s["table_%s_lora_over_base" % t] if "table_%s_lora_over_base" % t in s else "-" for t in tabs)
            out.append("| %s | %d | %.2f | %.0f | %.2f | %.0f | %.3f | %s | %.2f |" % (s["mix"], s["batch"], s["base_ms"], s["base_tok_s"], s["lora_ms"], s["lora_tok_s"],
                                                                                 s["lora_over_base"], extra, s["byte_floor_ratio"]))
        if d.get("checks"):
            out.append("")
            out.append("Checks against the same step in torch ops (f32, factors gathered per row): " + "; ".join(
                "%s rel. %.1e, argmax agreement %.0f %%, fallbacks %d" % (k, v["stream_vs_torch_rel"], 100 * v["argmax_agree"], v["fallbacks"]) for k, v in d["checks"].items()))
    return out


def main():
    bank, dec = [], []
    for path in sys.argv[1:]:
        label = os.path.basename(os.path.normpath(path))
        for name, dest in (("bankx.json", bank), ("decode.json", dec)):
            f = os.path.join(path, name)
            if os.path.exists(f):
                with open(f) as fh:
                    dest.append((label, json.load(fh)))
    lines = bank_tables(bank) if bank else []
    lines += decode_tables(dec)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
