// NOTE: the shrink/expand bodies repeat their prologue on purpose (the duplicates report lists it): each
// @triton.jit kernel is compiled alone, so the emitted Python (pinned by the golden snapshots) inlines it.
// Triton kernel bodies. They read their problem constants (K, N, R, R_PAD, SCALE, …) from
// module-level `tl.constexpr` globals that `emit-kernels.ts` writes above them, so one body
// serves every specialization and the row count M stays a run-time value.

/** Config helpers: autotune tables keyed by row bucket, pruned to the batch's bucket. */
export const CONFIG_HELPERS = `
def _configs(table, names):
    return [triton.Config(dict(zip(names, row[:-2])), num_warps=row[-2], num_stages=row[-1])
            for rows in table.values() for row in rows]


def _prune(table, names):
    """Keeps the configs listed for the smallest bucket at or above the launch's M_BUCKET."""
    def prune(configs, named_args, **kwargs):
        bucket = kwargs.get("M_BUCKET", named_args.get("M_BUCKET"))
        keys = sorted(table)
        want = set(table[next((b for b in keys if b >= bucket), keys[-1])])
        kept = [c for c in configs if tuple(c.kwargs[n] for n in names) + (c.num_warps, c.num_stages) in want]
        return kept or configs[:1]
    return prune
`;

/** Base GEMM with the LoRA fused in (LORA_MODE 0: none, 1: in-loop shrink, 2: shrink partials). */
export const GEMM_KERNEL = `
@triton.jit(do_not_specialize=["M"])
def gemm_kernel(x_ptr, w_ptr, a_ptr, b_ptr, t_ptr, bias_ptr, bias_b_ptr, y_ptr, M,
                M_BUCKET: tl.constexpr, LORA_MODE: tl.constexpr, T_SPLIT: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped launch order: GROUP_M row tiles read each W column tile while it is in L2.
    width = GROUP_M * num_pid_n
    first_m = (pid // width) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_m
    pid_n = (pid % width) // group_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, R_PAD)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * K + offs_k[None, :]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[None, :] * K + offs_k[:, None]
    a_ptrs = a_ptr + offs_r[None, :] * K + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    t = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if K % BLOCK_K == 0:
            xt = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
            wt = tl.load(w_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            mask_k = offs_k < K - k0
            xt = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            wt = tl.load(w_ptrs, mask=mask_n[None, :] & mask_k[:, None], other=0.0)
        acc = tl.dot(xt, wt, acc, input_precision=DOT_PRECISION)
        if LORA_MODE == 1:
            # t = x·Aᵀ from the x tile already loaded: the shrink costs no extra pass over x.
            if K % BLOCK_K == 0:
                at = tl.load(a_ptrs, mask=(offs_r < R)[None, :], other=0.0)
            else:
                at = tl.load(a_ptrs, mask=(offs_r < R)[None, :] & (offs_k < K - k0)[:, None], other=0.0)
            t = tl.dot(xt, at, t, input_precision=DOT_PRECISION)
            a_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if LORA_MODE == 2:
        for s in tl.static_range(T_SPLIT):
            t += tl.load(t_ptr + (s * M + offs_m.to(tl.int64))[:, None] * R_PAD + offs_r[None, :], mask=mask_m[:, None], other=0.0)
    if LORA_MODE != 0:
        # Expand in the epilogue: acc += (s·t)·Bᵀ, one more dot with contraction dim R_PAD.
        bt = tl.load(b_ptr + offs_n[None, :] * R + offs_r[:, None], mask=(offs_r < R)[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot((t * SCALE).to(bt.dtype), bt, acc, input_precision=DOT_PRECISION)
        if HAS_BIAS_B:
            acc += SCALE * tl.load(bias_b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
`;

/** t = x·Aᵀ for one adapter, as SPLIT_K fp32 partials (the shrink of the shrink/expand pair). */
export const DENSE_SHRINK_KERNEL = `
@triton.jit(do_not_specialize=["M"])
def shrink_kernel(x_ptr, a_ptr, t_ptr, M, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    K_PER_SPLIT: tl.constexpr = ((K + SPLIT_K * BLOCK_K - 1) // (SPLIT_K * BLOCK_K)) * BLOCK_K
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = split * K_PER_SPLIT + tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, R_PAD)
    mask_m = offs_m < M
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * K + offs_k[None, :]
    a_ptrs = a_ptr + offs_r[None, :] * K + offs_k[:, None]
    t = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        mask_k = offs_k < K
        xt = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        at = tl.load(a_ptrs, mask=(offs_r < R)[None, :] & mask_k[:, None], other=0.0)
        t = tl.dot(xt, at, t, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        offs_k += BLOCK_K
    tl.store(t_ptr + (split * M + offs_m.to(tl.int64))[:, None] * R_PAD + offs_r[None, :], t, mask=mask_m[:, None])
`;

/** SGMV/BGMV shrink and expand over RowMeta blocks (one adapter per block, mixed ranks). */
export const GROUPED_KERNELS = `
@triton.jit(do_not_specialize=["M"])
def grouped_shrink_kernel(x_ptr, a_ptr, offset_ptr, rank_ptr, order_ptr, group_ptr, row0_ptr, nrows_ptr, t_ptr, M,
                          M_BUCKET: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    blk = tl.program_id(0)
    split = tl.program_id(1)
    nrows = tl.load(nrows_ptr + blk)
    if nrows == 0:
        return
    adapter = tl.load(group_ptr + blk)
    row0 = tl.load(row0_ptr + blk)
    rank = tl.load(rank_ptr + adapter)
    first = tl.load(offset_ptr + adapter)
    K_PER_SPLIT: tl.constexpr = ((K + SPLIT_K * BLOCK_K - 1) // (SPLIT_K * BLOCK_K)) * BLOCK_K
    offs_i = tl.arange(0, BLOCK_M)
    mask_i = offs_i < nrows
    rows = tl.load(order_ptr + row0 + offs_i, mask=mask_i, other=0).to(tl.int64)
    offs_r = tl.arange(0, R_PAD)
    # Rank tiles past this adapter's rank are masked: they move no bytes.
    mask_r = offs_r < rank
    offs_k = split * K_PER_SPLIT + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
    a_ptrs = a_ptr + (first + offs_r)[None, :] * K + offs_k[:, None]
    t = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        mask_k = offs_k < K
        xt = tl.load(x_ptrs, mask=mask_i[:, None] & mask_k[None, :], other=0.0)
        at = tl.load(a_ptrs, mask=mask_r[None, :] & mask_k[:, None], other=0.0)
        t = tl.dot(xt, at, t, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        offs_k += BLOCK_K
    tl.store(t_ptr + (split * M + rows)[:, None] * R_PAD + offs_r[None, :], t, mask=mask_i[:, None])


@triton.jit(do_not_specialize=["M"])
def grouped_expand_kernel(t_ptr, b_ptr, offset_ptr, rank_ptr, scale_ptr, bias_b_ptr, order_ptr, group_ptr, row0_ptr, nrows_ptr, y_ptr, M,
                          M_BUCKET: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    blk = tl.program_id(0)
    pid_n = tl.program_id(1)
    nrows = tl.load(nrows_ptr + blk)
    if nrows == 0:
        return
    adapter = tl.load(group_ptr + blk)
    row0 = tl.load(row0_ptr + blk)
    rank = tl.load(rank_ptr + adapter)
    first = tl.load(offset_ptr + adapter)
    scale = tl.load(scale_ptr + adapter)
    offs_i = tl.arange(0, BLOCK_M)
    mask_i = offs_i < nrows
    rows = tl.load(order_ptr + row0 + offs_i, mask=mask_i, other=0).to(tl.int64)
    offs_r = tl.arange(0, R_PAD)
    mask_r = offs_r < rank
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    t = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        t += tl.load(t_ptr + (s * M + rows)[:, None] * R_PAD + offs_r[None, :], mask=mask_i[:, None] & mask_r[None, :], other=0.0)
    # B_a is [N, r_a] row-major from first·N on: a [BLOCK_N, r_a] slice is one contiguous run.
    bt = tl.load(b_ptr + first * N + offs_n[None, :] * rank + offs_r[:, None], mask=mask_r[:, None] & mask_n[None, :], other=0.0)
    delta = tl.dot((t * scale).to(bt.dtype), bt, input_precision=DOT_PRECISION)
    if HAS_BIAS_B:
        delta += scale * tl.load(bias_b_ptr + adapter * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rows[:, None] * N + offs_n[None, :]
    mask = mask_i[:, None] & mask_n[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=mask)
`;

/** Routed expert GEMM: rows grouped by expert (RowMeta), x·W_eᵀ + s·(x·A_eᵀ)·B_eᵀ in one kernel. */
export const MOE_KERNEL = `
@triton.jit(do_not_specialize=["M"])
def moe_kernel(x_ptr, w_ptr, a_ptr, b_ptr, order_ptr, group_ptr, row0_ptr, nrows_ptr, y_ptr, M,
               M_BUCKET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    blk = tl.program_id(0)
    pid_n = tl.program_id(1)
    nrows = tl.load(nrows_ptr + blk)
    if nrows == 0:
        return
    expert = tl.load(group_ptr + blk).to(tl.int64)
    row0 = tl.load(row0_ptr + blk)
    offs_i = tl.arange(0, BLOCK_M)
    mask_i = offs_i < nrows
    rows = tl.load(order_ptr + row0 + offs_i, mask=mask_i, other=0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, R_PAD)
    x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
    w_ptrs = w_ptr + expert * W_SE + offs_n[None, :] * W_SN + offs_k[:, None] * W_SK
    a_ptrs = a_ptr + expert * (R * K) + offs_r[None, :] * K + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    t = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k0
        xt = tl.load(x_ptrs, mask=mask_i[:, None] & mask_k[None, :], other=0.0)
        wt = tl.load(w_ptrs, mask=mask_n[None, :] & mask_k[:, None], other=0.0)
        acc = tl.dot(xt, wt, acc, input_precision=DOT_PRECISION)
        if HAS_LORA:
            at = tl.load(a_ptrs, mask=(offs_r < R)[None, :] & mask_k[:, None], other=0.0)
            t = tl.dot(xt, at, t, input_precision=DOT_PRECISION)
            a_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * W_SK
    if HAS_LORA:
        bt = tl.load(b_ptr + expert * (N * R) + offs_n[None, :] * R + offs_r[:, None], mask=(offs_r < R)[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot((t * SCALE).to(bt.dtype), bt, acc, input_precision=DOT_PRECISION)
    tl.store(y_ptr + rows[:, None] * N + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask_i[:, None] & mask_n[None, :])
`;
