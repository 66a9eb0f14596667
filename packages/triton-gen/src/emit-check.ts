import type { BankGatheredKernel, BankGroupedKernel, LoraLinearKernel, MoeLoraKernel } from './patterns.js';
import { byKernelFamily } from '@stageml/kernel-patterns';
import { type TritonKernel, pyHeader } from './python.js';

/** Default bench row counts by kernel kind (check rows add ragged sizes in the same buckets). */
export const BENCH_ROWS: Readonly<Record<TritonKernel['kind'], readonly number[]>> = {
  loraLinear: [1, 16, 64, 128, 256, 1024, 4096],
  bankGrouped: [1, 4, 16, 64, 256],
  bankGathered: [1, 4, 16, 64, 256],
  moeLora: [64, 512, 2048],
};

const RAGGED: Readonly<Record<TritonKernel['kind'], readonly number[]>> = {
  loraLinear: [37, 1000],
  bankGrouped: [37],
  bankGathered: [37],
  moeLora: [37, 1000],
};

function loraLinear(k: LoraLinearKernel): string {
  const lora = k.lora !== undefined;
  return `HAS_LORA = ${lora ? 'True' : 'False'}
RANK = ${String(k.lora?.rank ?? 0)}
SCALE = ${String(k.lora?.scale ?? 1)}


def make_inputs(m, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    inp = {"x": randn((m, K), 1.0, g, device), "w": randn((N, K), K ** -0.5, g, device),
           "bias": randn((N,), 1.0, g, device) if ${k.bias !== undefined ? 'True' : 'False'} else None}
    if HAS_LORA:
        inp.update(a=randn((RANK, K), K ** -0.5, g, device), b=randn((N, RANK), RANK ** -0.5, g, device),
                   bias_b=randn((N,), 1.0, g, device) if ${k.lora?.biasB !== undefined ? 'True' : 'False'} else None)
    return inp


def rows_of(inp):
    return inp["x"].shape[0]


def reference(inp):
    d = {k: (v.double() if v is not None else None) for k, v in inp.items()}
    y = d["x"] @ d["w"].T
    if d["bias"] is not None:
        y = y + d["bias"]
    if HAS_LORA:
        delta = (d["x"] @ d["a"].T) @ d["b"].T
        if d["bias_b"] is not None:
            delta = delta + d["bias_b"]
        y = y + SCALE * delta
    return y


def run(inp, out, mode="auto"):
    if HAS_LORA:
        return launch.run(inp["x"], inp["w"], inp["a"], inp["b"], bias=inp["bias"], bias_b=inp["bias_b"], out=out, mode=mode)
    return launch.run(inp["x"], inp["w"], bias=inp["bias"], out=out)


def eager(inp):
    F = torch.nn.functional
    y = F.linear(inp["x"], inp["w"], inp["bias"])
    if HAS_LORA:
        y = y + SCALE * F.linear(F.linear(inp["x"], inp["a"]), inp["b"], inp["bias_b"])
    return y


def cublas(inp):
    return torch.matmul(inp["x"], inp["w"].T)


def traffic(inp):
    m = rows_of(inp)
    nbytes = (m * K + N * K + m * N + (RANK * (K + N) if HAS_LORA else 0)) * ES
    return nbytes, 2 * m * N * K + (2 * m * RANK * (K + N) if HAS_LORA else 0)


def parts(inp, out):
    # Both LoRA modes, where the choice between them matters (the GEMM is no longer latency-bound).
    if not HAS_LORA or rows_of(inp) < 64:
        return []
    nbytes, flops = traffic(inp)
    return [("fused", lambda: run(inp, out, "fused"), nbytes, flops), ("pair", lambda: run(inp, out, "pair"), nbytes, flops)]
`;
}

function bank(k: BankGroupedKernel | BankGatheredKernel): string {
  const ranks = k.kind === 'bankGrouped' ? 'launch.RANKS' : '[launch.RANK] * launch.NUM_ADAPTERS';
  const pack = k.kind === 'bankGrouped' ? 'launch.pack(a_list, b_list, scales)' : 'launch.pack(torch.stack(a_list), torch.stack(b_list), torch.tensor(scales, device=device))';
  return `RANKS = ${ranks}
NUM_ADAPTERS = len(RANKS)
# Share of rows that take the base path only (no adapter).
BASE_ONLY = 0.1


def make_inputs(m, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    a_list = [randn((r, K), K ** -0.5, g, device) for r in RANKS]
    b_list = [randn((N, r), r ** -0.5, g, device) for r in RANKS]
    scales = [0.5 + (i % 4) * 0.5 for i in range(NUM_ADAPTERS)]
    group = torch.randint(0, NUM_ADAPTERS, (m,), generator=g, device=device, dtype=torch.int32)
    base_only = torch.rand((m,), generator=g, device=device) < BASE_ONLY
    group = torch.where(base_only, torch.full_like(group, -1), group)
    inp = {"x": randn((m, K), 1.0, g, device), "w": randn((N, K), K ** -0.5, g, device),
           "bias": randn((N,), 1.0, g, device) if ${k.bias !== undefined ? 'True' : 'False'} else None,
           "a_list": a_list, "b_list": b_list, "scales": scales, "group": group}
    inp["bank"] = ${pack}
    inp["meta"] = common.make_row_meta(group, NUM_ADAPTERS)
    hostg = group.tolist()
    inp["rows_of"] = {a: torch.tensor([i for i, x in enumerate(hostg) if x == a], device=device, dtype=torch.int64)
                      for a in sorted(set(hostg)) if a >= 0}
    return inp


def rows_of(inp):
    return inp["x"].shape[0]


def reference(inp):
    x = inp["x"].double()
    y = x @ inp["w"].double().T
    if inp["bias"] is not None:
        y = y + inp["bias"].double()
    for a, rows in inp["rows_of"].items():
        y[rows] += inp["scales"][a] * (x[rows] @ inp["a_list"][a].double().T) @ inp["b_list"][a].double().T
    return y


def run(inp, out):
    return launch.run(inp["x"], inp["w"], inp["bank"], inp["group"], bias=inp["bias"], out=out, meta=inp["meta"])


def eager(inp):
    F = torch.nn.functional
    x = inp["x"]
    y = F.linear(x, inp["w"], inp["bias"])
    for a, rows in inp["rows_of"].items():
        y.index_add_(0, rows, inp["scales"][a] * F.linear(F.linear(x[rows], inp["a_list"][a]), inp["b_list"][a]))
    return y


def cublas(inp):
    return torch.matmul(inp["x"], inp["w"].T)


def lora_traffic(inp):
    """Bytes and flops of the shrink and of the expand alone."""
    meta, bank = inp["meta"], inp["bank"]
    split = launch.split_k_for(meta)
    active = sum(int(r.numel()) for r in inp["rows_of"].values())
    used = sum(RANKS[a] for a in inp["rows_of"])
    rp = launch.kernels.R_PAD.value
    flops = sum(2 * int(r.numel()) * RANKS[a] for a, r in inp["rows_of"].items())
    shrink = ((active * K + used * K) * ES + split * active * rp * 4, flops * K)
    expand = ((used * N + 2 * active * N) * ES + split * active * rp * 4, flops * N)
    return shrink, expand, split


def traffic(inp):
    m = rows_of(inp)
    (sb, sf), (eb, ef), _ = lora_traffic(inp)
    return (m * K + N * K + m * N) * ES + sb + eb, 2 * m * N * K + sf + ef


def parts(inp, out):
    x2 = inp["x"]
    (sb, sf), (eb, ef), split = lora_traffic(inp)
    t = launch.shrink(x2, inp["bank"], inp["meta"], split)
    y = torch.zeros((rows_of(inp), N), device=x2.device, dtype=DTYPE)
    return [("shrink", lambda: launch.shrink(x2, inp["bank"], inp["meta"], split), sb, sf),
            ("expand", lambda: launch.expand(y, t, inp["bank"], inp["meta"]), eb, ef)]
`;
}

function moe(k: MoeLoraKernel): string {
  const lora = k.lora !== undefined;
  const wShape = k.transposeW ? '(E, N, K)' : '(E, K, N)';
  const wT = k.transposeW ? 'w[e].T' : 'w[e]';
  return `E, RANK, SCALE, HAS_LORA = launch.NUM_EXPERTS, ${String(k.lora?.rank ?? 0)}, ${String(k.lora?.scale ?? 1)}, ${lora ? 'True' : 'False'}


def make_inputs(m, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    inp = {"x": randn((m, K), 1.0, g, device), "w": randn(${wShape}, K ** -0.5, g, device),
           "experts": torch.randint(0, E, (m,), generator=g, device=device, dtype=torch.int64)}
    if HAS_LORA:
        inp.update(a=randn((E, RANK, K), K ** -0.5, g, device), b=randn((E, N, RANK), RANK ** -0.5, g, device))
    hoste = inp["experts"].tolist()
    inp["rows_of"] = {e: torch.tensor([i for i, x in enumerate(hoste) if x == e], device=device, dtype=torch.int64)
                      for e in sorted(set(hoste))}
    inp["xs"] = {e: inp["x"][rows].contiguous() for e, rows in inp["rows_of"].items()}
    inp["meta"] = common.make_row_meta(inp["experts"], E, launch.block_m_for(m))
    return inp


def rows_of(inp):
    return inp["x"].shape[0]


def _expert(inp, e, x, cast):
    w = cast(inp["w"])
    y = x @ ${wT}
    if HAS_LORA:
        y = y + SCALE * (x @ cast(inp["a"])[e].T) @ cast(inp["b"])[e].T
    return y


def reference(inp):
    x = inp["x"].double()
    y = torch.empty((rows_of(inp), N), device=x.device, dtype=torch.float64)
    for e, rows in inp["rows_of"].items():
        y[rows] = _expert(inp, e, x[rows], lambda t: t.double())
    return y


def run(inp, out):
    return launch.run(inp["x"], inp["w"], inp["experts"], inp.get("a"), inp.get("b"), out=out, meta=inp["meta"])


def eager(inp):
    y = torch.empty((rows_of(inp), N), device=inp["x"].device, dtype=DTYPE)
    for e, rows in inp["rows_of"].items():
        y[rows] = _expert(inp, e, inp["x"][rows], lambda t: t)
    return y


def cublas(inp):
    w = inp["w"]
    return [torch.matmul(xs, ${wT}) for e, xs in inp["xs"].items()]


def traffic(inp):
    m, used = rows_of(inp), len(inp["rows_of"])
    nbytes = (m * K + used * N * K + m * N + (used * RANK * (K + N) if HAS_LORA else 0)) * ES
    return nbytes, 2 * m * N * K + (2 * m * RANK * (K + N) if HAS_LORA else 0)


def parts(inp, out):
    return []
`;
}

function specific(k: TritonKernel): string {
  return byKernelFamily(k, { loraLinear, bank, moe });
}

/**
 * The check-and-bench script (`<name>_check.py`). On a GPU it compares the launcher with a float64
 * torch reference on fresh random inputs (outputs NaN-poisoned before each run, so unwritten
 * elements fail), then times it with `triton.testing.do_bench` (median) against torch eager
 * (PEFT-style) and cuBLAS (`torch.matmul`, the base GEMM alone), and against a device-to-device
 * copy of the same number of bytes.
 */
export function emitCheck(k: TritonKernel): string {
  const rows = [...new Set([...BENCH_ROWS[k.kind], ...RAGGED[k.kind]])].sort((p, q) => p - q);
  return `${pyHeader(`Check and bench of ${k.name} (${k.kind}, ${k.dtype}): correctness against float64, then timing.`)}import argparse
import sys

import torch

import stageml_triton_common as common
import ${k.name}_launch as launch

NAME, KIND, DTYPE_NAME = "${k.name}", "${k.kind}", "${k.dtype}"
DTYPE = launch.DTYPE
K, N = launch.IN_DIM, launch.OUT_DIM
ES = torch.tensor([], dtype=DTYPE).element_size()
BENCH_ROWS = [${BENCH_ROWS[k.kind].join(', ')}]
CHECK_ROWS = [${rows.join(', ')}]


def randn(shape, scale, gen, device):
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(DTYPE)


${specific(k)}

def check(m, device, trials):
    """Worst relative error over fresh random inputs, with the output NaN-poisoned before each run."""
    worst = 0.0
    for trial in range(trials):
        inp = make_inputs(m, 1000 * m + trial, device)
        out = torch.full((rows_of(inp), N), float("nan"), device=device, dtype=DTYPE)
        got = run(inp, out)
        worst = max(worst, common.rel_error(got.reshape(-1, N), reference(inp)))
    return worst


def _timing(label, fn, fns, nbytes, flops, peak):
    """do_bench median (L2 flushed before each call, launch overhead included) and the CUDA-graph
    time per call over rotating operand sets (no launch overhead, no L2 reuse)."""
    ms = common.bench_ms(fn)
    graph = common.bench_graph_ms(fns)
    gbps = nbytes / (ms * 1e-3) / 1e9
    ggbps = nbytes / (graph * 1e-3) / 1e9
    same = common.copy_gbps(nbytes) if peak else None
    return {"part": label, "time_ms": ms, "gbps": gbps, "tflops": flops / (ms * 1e-3) / 1e12,
            "graph_ms": graph, "graph_gbps": ggbps, "graph_tflops": flops / (graph * 1e-3) / 1e12,
            "l2_resident": len(fns) * nbytes < 3 * 50e6, "copy_gbps_same_size": same,
            "copy_frac_same_size": gbps / same if same else None, "graph_copy_frac": ggbps / peak if peak else None,
            "copy_frac_peak": gbps / peak if peak else None}


def bench(m, device, peak):
    inp = make_inputs(m, 7, device)
    out = torch.empty((rows_of(inp), N), device=device, dtype=DTYPE)
    nbytes, flops = traffic(inp)
    sets = [(inp, out)] + [(make_inputs(m, 8 + i, device), torch.empty_like(out)) for i in range(common.rotation_sets(nbytes) - 1)]
    entry = _timing("run", lambda: run(inp, out), [lambda s=s: run(*s) for s in sets], nbytes, flops, peak)
    entry["eager_ms"] = common.bench_ms(lambda: eager(inp))
    entry["cublas_base_ms"] = common.bench_ms(lambda: cublas(inp))
    entry["cublas_base_graph_ms"] = common.bench_graph_ms([lambda s=s: cublas(s[0]) for s in sets])
    entry["vs_eager"] = entry["time_ms"] / entry["eager_ms"]
    entry["vs_cublas_base"] = entry["time_ms"] / entry["cublas_base_ms"]
    entry["graph_vs_cublas_base"] = entry["graph_ms"] / entry["cublas_base_graph_ms"]
    extra = []
    for j, (label, fn, b, f) in enumerate(parts(inp, out)):
        # Each part rotates through enough sets of its own to leave the L2 (parts move fewer bytes).
        more = [(make_inputs(m, 100 + i, device), torch.empty_like(out)) for i in range(common.rotation_sets(b) - len(sets))]
        extra.append(_timing(label, fn, [parts(*s)[j][1] for s in sets + more], b, f, peak))
    return [entry] + extra


def main(argv=None, peak=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default=None, help="comma-separated row counts (default: the kernel's bench rows)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--no-bench", action="store_true")
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")] if args.rows else CHECK_ROWS
    bound = common.ERROR_BOUNDS[DTYPE_NAME]
    if peak is None and not args.no_bench:
        peak = common.copy_gbps(2 << 30)
    results = []
    for m in rows:
        err = check(m, args.device, args.trials)
        head = {"kernel": NAME, "kind": KIND, "dtype": DTYPE_NAME, "rows": m, "rel_error": err, "bound": bound,
                "ok": err <= bound}
        if args.no_bench or (args.rows is None and m not in BENCH_ROWS):
            results.append(dict(head, part="check"))
            continue
        for entry in bench(m, args.device, peak):
            results.append(dict(head, **entry))
    return results


COLUMNS = [("kernel", "{}"), ("rows", "{}"), ("part", "{}"), ("rel_error", "{:.2e}"), ("ok", "{}"), ("time_ms", "{:.4f}"),
           ("graph_ms", "{:.4f}"), ("graph_gbps", "{:.0f}"), ("graph_tflops", "{:.1f}"), ("graph_copy_frac", "{:.2f}"),
           ("vs_eager", "{:.2f}"), ("vs_cublas_base", "{:.2f}"), ("graph_vs_cublas_base", "{:.2f}")]

if __name__ == "__main__":
    out = main()
    common.print_table(out, COLUMNS)
    sys.exit(0 if all(r["ok"] for r in out) else 1)
`;
}
