import type { BankGatheredKernel, BankGroupedKernel, LoraLinearKernel, MoeLoraKernel, ResidualKernel } from './patterns.js';
import { byKernelFamily } from '@stageml/kernel-patterns';
import { type TritonKernel, pyFloat, pyHeader } from './python.js';

const CHECK = `
def _check(name, t, shape, dtype=None):
    dtype = DTYPE if dtype is None else dtype
    if t is None:
        raise ValueError(f"{name} is required")
    if t.dtype != dtype or tuple(t.shape) != tuple(shape) or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous {dtype} tensor of shape {tuple(shape)}, got {t.dtype} {tuple(t.shape)} (contiguous: {t.is_contiguous()})")


def _rows(x):
    if x.shape[-1] != IN_DIM:
        raise ValueError(f"x must end in {IN_DIM}, got {tuple(x.shape)}")
    x2 = x.reshape(-1, IN_DIM)
    return x2 if x2.is_contiguous() else x2.contiguous()
`;

function head(k: ResidualKernel, summary: string): string {
  return `${pyHeader(`Launcher of ${k.name}: ${summary}`)}import torch
import triton

import stageml_triton_common as common
import ${k.name} as kernels

DTYPE = common.TORCH_DTYPES["${k.dtype}"]
IN_DIM, OUT_DIM = ${String(k.inDim)}, ${String(k.outDim)}
${CHECK}`;
}

const BASE_GEMM = `
def base(x2, w, bias, y, t=None, a=None, b=None, bias_b=None, lora_mode=0):
    """Runs gemm_kernel on rows x2 [M, K] into y [M, N]."""
    m = x2.shape[0]
    t_split = t.shape[0] if lora_mode == 2 else 1
    args = (x2, w, a if a is not None else w, b if b is not None else w, t if t is not None else y,
            bias if bias is not None else y, bias_b if bias_b is not None else y, y, m)
    constexprs = {"M_BUCKET": common.m_bucket(m), "LORA_MODE": lora_mode, "T_SPLIT": t_split}
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(OUT_DIM, meta["BLOCK_N"]),)
    common.run_kernel(kernels.gemm_kernel, kernels.gemm_tuned, grid, args, constexprs, kernels.GEMM_DEFAULT)
`;

function loraLinear(k: LoraLinearKernel): string {
  if (k.lora === undefined) {
    return `${head(k, 'y = x·Wᵀ (+ b).')}${BASE_GEMM}

def run(x, w, bias=None, out=None):
    """y [..., N] = x·Wᵀ + b for x [..., K]."""
    x2 = _rows(x)
    _check("x", x2, x2.shape)
    _check("w", w, (OUT_DIM, IN_DIM))
    if bias is not None:
        _check("bias", bias, (OUT_DIM,))
    m = x2.shape[0]
    y = out if out is not None else torch.empty((m, OUT_DIM), device=x.device, dtype=DTYPE)
    _check("out", y, (m, OUT_DIM))
    if m > 0:
        base(x2, w, bias, y)
    return y.reshape(*x.shape[:-1], OUT_DIM)
`;
  }
  return `${head(k, 'y = x·Wᵀ + b + s·((x·Aᵀ)·Bᵀ + b_B).')}RANK = ${String(k.lora.rank)}
# Rows for which "auto" runs the shrink/expand pair instead of the in-loop shrink, as measured on
# an H200 (bench/results/triton.md, CUDA-graph timings): up to PAIR_MAX_SMALL rows the in-loop
# shrink stalls the skinny GEMM's pipeline, and from PAIR_MIN_ROWS on the GEMM is compute-bound
# and the in-loop shrink's r/BLOCK_N extra tensor-core work costs more than a second launch.
PAIR_MAX_SMALL = 32
PAIR_MIN_ROWS = 1024
${BASE_GEMM}

def shrink(x2, a, split_k=None):
    """t = x·Aᵀ as fp32 partials [split_k, M, R_PAD] whose sum is t."""
    m = x2.shape[0]
    block_m = 64 if m >= PAIR_MIN_ROWS else 16
    if split_k is None:
        split_k = max(1, min(8, 264 // triton.cdiv(m, block_m)))
    t = torch.empty((split_k, m, kernels.R_PAD.value), device=x2.device, dtype=torch.float32)
    kernels.shrink_kernel[(triton.cdiv(m, block_m), split_k)](x2, a, t, m, SPLIT_K=split_k, BLOCK_M=block_m,
                                                              BLOCK_K=32 if common.INTERPRET else 128)
    return t


def run(x, w, a, b, bias=None, bias_b=None, out=None, mode="auto"):
    """y [..., N] for x [..., K]. mode: "fused" (one launch: the shrink inside the GEMM's K loop),
    "pair" (shrink kernel, then the GEMM with the expand in its epilogue) or "auto" (by rows: the
    pair for skinny and for compute-bound batches, see PAIR_MAX_SMALL and PAIR_MIN_ROWS)."""
    x2 = _rows(x)
    _check("x", x2, x2.shape)
    _check("w", w, (OUT_DIM, IN_DIM))
    _check("a", a, (RANK, IN_DIM))
    _check("b", b, (OUT_DIM, RANK))
    if bias is not None:
        _check("bias", bias, (OUT_DIM,))
    if bias_b is not None:
        _check("bias_b", bias_b, (OUT_DIM,))
    m = x2.shape[0]
    y = out if out is not None else torch.empty((m, OUT_DIM), device=x.device, dtype=DTYPE)
    _check("out", y, (m, OUT_DIM))
    if mode == "auto":
        mode = "pair" if m <= PAIR_MAX_SMALL or m >= PAIR_MIN_ROWS else "fused"
    if mode not in ("fused", "pair"):
        raise ValueError(f"mode must be auto, fused or pair, got {mode!r}")
    if m > 0:
        if mode == "pair":
            base(x2, w, bias, y, t=shrink(x2, a), a=a, b=b, bias_b=bias_b, lora_mode=2)
        else:
            base(x2, w, bias, y, a=a, b=b, bias_b=bias_b, lora_mode=1)
    return y.reshape(*x.shape[:-1], OUT_DIM)
`;
}

function bank(k: BankGroupedKernel | BankGatheredKernel): string {
  const grouped = k.kind === 'bankGrouped';
  const specific = grouped
    ? `RANKS = [${k.groups.map((g) => String(g.rank)).join(', ')}]
SCALES = [${k.groups.map((g) => pyFloat(g.scale)).join(', ')}]
NUM_ADAPTERS = ${String(k.groups.length)}


def pack(a_list, b_list, scales=None):
    """Packs the adapters' factors (A_g [r_g, K], B_g [N, r_g]) once, when adapters load."""
    if len(a_list) != NUM_ADAPTERS or len(b_list) != NUM_ADAPTERS:
        raise ValueError(f"expected {NUM_ADAPTERS} adapters")
    for i, (a, b) in enumerate(zip(a_list, b_list)):
        _check(f"a[{i}]", a, (RANKS[i], IN_DIM))
        _check(f"b[{i}]", b, (OUT_DIM, RANKS[i]))
    return common.pack_bank(a_list, b_list, SCALES if scales is None else scales)


def group_of_row_from_rows(rows_list, num_rows, device):
    """Adapter index of each row (-1: base only) from the graph's per-adapter row lists."""
    g = torch.full((num_rows,), -1, device=device, dtype=torch.int32)
    hits = torch.zeros((num_rows,), device=device, dtype=torch.int32)
    for i, rows in enumerate(rows_list):
        g[rows] = i
        hits.index_add_(0, rows, torch.ones_like(rows, dtype=torch.int32))
    if bool((hits > 1).any()):
        raise ValueError("a row is listed under two adapters: the grouped kernels give each row one adapter")
    return g
`
    : `NUM_ADAPTERS, RANK, ROWS_PER_ID = ${String(k.numAdapters)}, ${String(k.rank)}, ${String(k.rowsPerId)}


def pack(a_stack, b_stack, scales):
    """Packs stacked factors A [L, r, K], B [L, N, r] and scales [L] once, when adapters load."""
    _check("a", a_stack, (NUM_ADAPTERS, RANK, IN_DIM))
    _check("b", b_stack, (NUM_ADAPTERS, OUT_DIM, RANK))
    return common.pack_stacked_bank(a_stack, b_stack, scales)


def group_of_row_from_ids(ids):
    """Adapter index of each flattened row from the per-sequence adapter ids."""
    return ids.to(torch.int32).repeat_interleave(ROWS_PER_ID)
`;
  return `${head(k, 'base GEMM, then grouped LoRA shrink and expand over adapter blocks.')}${specific}${BASE_GEMM}

def split_k_for(meta):
    """K splits of the shrink: enough programs for every SM while each still streams whole tiles."""
    split = 1
    while split < 16 and meta.num_blocks * split < 528:
        split *= 2
    return split


def shrink(x2, bank, meta, split_k=None):
    """t partials [split_k, M, R_PAD] with t[row] = x[row]·A_aᵀ for every row in a block."""
    m = x2.shape[0]
    split_k = split_k_for(meta) if split_k is None else split_k
    t = torch.empty((split_k, m, kernels.R_PAD.value), device=x2.device, dtype=torch.float32)
    args = (x2, bank.a, bank.offset, bank.rank, meta.order, meta.group, meta.row0, meta.nrows, t, m)
    constexprs = {"M_BUCKET": common.m_bucket(m), "SPLIT_K": split_k, "BLOCK_M": meta.block_m}
    common.run_kernel(kernels.grouped_shrink_kernel, kernels.grouped_shrink_tuned, lambda meta_: (meta.num_blocks, split_k),
                      args, constexprs, kernels.SHRINK_DEFAULT)
    return t


def expand(y, t, bank, meta, bias_b=None):
    """y[row] += s_a·t[row]·B_aᵀ (+ s_a·b_B[a]) in place for every row in a block."""
    m = y.shape[0]
    args = (t, bank.b, bank.offset, bank.rank, bank.scale, bias_b if bias_b is not None else y,
            meta.order, meta.group, meta.row0, meta.nrows, y, m)
    constexprs = {"M_BUCKET": common.m_bucket(m), "SPLIT_K": t.shape[0], "BLOCK_M": meta.block_m}
    grid = lambda cfg: (meta.num_blocks, triton.cdiv(OUT_DIM, cfg["BLOCK_N"]))
    common.run_kernel(kernels.grouped_expand_kernel, kernels.grouped_expand_tuned, grid, args, constexprs, kernels.EXPAND_DEFAULT)


def run(x, w, bank, group_of_row, bias=None, bias_b=None, out=None, meta=None):
    """y [..., N] = x·Wᵀ + b, plus each row's adapter delta (group_of_row[i] = -1: none).
    bias_b: per-adapter B biases [L, N] or None. meta: RowMeta, built once per batch if given."""
    x2 = _rows(x)
    _check("x", x2, x2.shape)
    _check("w", w, (OUT_DIM, IN_DIM))
    if bias is not None:
        _check("bias", bias, (OUT_DIM,))
    if bias_b is not None:
        _check("bias_b", bias_b, (bank.num_adapters, OUT_DIM))
    m = x2.shape[0]
    if group_of_row.shape != (m,):
        raise ValueError(f"group_of_row must be [{m}], got {tuple(group_of_row.shape)}")
    y = out if out is not None else torch.empty((m, OUT_DIM), device=x.device, dtype=DTYPE)
    _check("out", y, (m, OUT_DIM))
    if m > 0:
        meta = common.make_row_meta(group_of_row, bank.num_adapters) if meta is None else meta
        base(x2, w, bias, y)
        expand(y, shrink(x2, bank, meta), bank, meta, bias_b)
    return y.reshape(*x.shape[:-1], OUT_DIM)
`;
}

function moe(k: MoeLoraKernel): string {
  const wShape = k.transposeW ? `(NUM_EXPERTS, OUT_DIM, IN_DIM)` : `(NUM_EXPERTS, IN_DIM, OUT_DIM)`;
  const lora = k.lora !== undefined;
  return `${head(k, `routed expert GEMM${lora ? ' with expert LoRA' : ''}.`)}NUM_EXPERTS, RANK = ${String(k.numExperts)}, ${String(k.lora?.rank ?? 0)}
W_SHAPE = ${wShape}


def block_m_for(num_rows):
    """Rows per expert block: about one block per expert while experts get few rows (each block
    streams its expert's whole W), at most 128 rows (tensor-core tiles)."""
    per_expert = -(-num_rows // NUM_EXPERTS)
    for bm in (16, 32, 64):
        if per_expert <= bm:
            return bm
    return 128


def run(x, w, experts, a=None, b=None, out=None, meta=None):
    """y[n] = x[n]·W_{e_n}ᵀ${lora ? ' + s·(x[n]·A_{e_n}ᵀ)·B_{e_n}ᵀ' : ''} for rows x [M, K] routed to experts [M]."""
    x2 = _rows(x)
    _check("x", x2, x2.shape)
    _check("w", w, W_SHAPE)
${lora ? '    _check("a", a, (NUM_EXPERTS, RANK, IN_DIM))\n    _check("b", b, (NUM_EXPERTS, OUT_DIM, RANK))\n' : ''}    m = x2.shape[0]
    if experts.shape != (m,):
        raise ValueError(f"experts must be [{m}], got {tuple(experts.shape)}")
    y = out if out is not None else torch.empty((m, OUT_DIM), device=x.device, dtype=DTYPE)
    _check("out", y, (m, OUT_DIM))
    if m == 0:
        return y
    meta = common.make_row_meta(experts, NUM_EXPERTS, block_m_for(m)) if meta is None else meta
    args = (x2, w, a if a is not None else w, b if b is not None else w, meta.order, meta.group, meta.row0, meta.nrows, y, m)
    constexprs = {"M_BUCKET": common.m_bucket(m), "BLOCK_M": meta.block_m}
    grid = lambda cfg: (meta.num_blocks, triton.cdiv(OUT_DIM, cfg["BLOCK_N"]))
    common.run_kernel(kernels.moe_kernel, kernels.moe_tuned, grid, args, constexprs, kernels.MOE_DEFAULT)
    return y
`;
}

/** The launcher module (`<name>_launch.py`): argument checks, row metadata and kernel launches. */
export function emitLauncher(k: TritonKernel): string {
  return byKernelFamily(k, { loraLinear, bank, moe });
}
