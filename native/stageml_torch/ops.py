"""Every op of the IR registry (packages/ir/src/ops) as a torch function.

Each entry takes (operands, attrs, ctx) and returns a list of tensors; `ctx` carries the device,
the dim bindings (`ctx.dim(d)`), the declared result dtypes and the random generator. Results are
cast to their declared dtype by the caller. f16/bf16 norms, softmax and attention scores are
computed in f32 and rounded once (as the reference interpreter rounds once); on the CPU every
f16/bf16 op computes in f32 (CPU torch lacks or emulates half matmuls).
"""

import math
import weakref

import torch
import torch.nn.functional as F

from . import errors

DTYPES = {
    "f64": torch.float64,
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i64": torch.int64,
    "i32": torch.int32,
    "i8": torch.int8,
    "u8": torch.uint8,
    "bool": torch.bool,
}

HALF = (torch.float16, torch.bfloat16)
_SDPA = hasattr(F, "scaled_dot_product_attention")


def pinned(t, device):
    """`t` as the source of a copy to `device` that need not wait for the device: a pinned copy of
    a host tensor bound for a CUDA device (a copy from pageable memory may first wait for
    everything queued on the stream), else `t` itself."""
    return t.pin_memory() if torch.device(device).type == "cuda" and t.device.type == "cpu" else t


def queued(t, device):
    """Host tensor `t` on `device`. On a CUDA device the copy is queued on the current stream from
    pinned memory and the host goes on: a blocking copy (or one from pageable memory) first waits
    for everything already queued there, so a decode step launched ahead (ahead.py) would start
    only after the step before it had ended, the device idle while the host staged it."""
    return pinned(t, device).to(device, non_blocking=True)


def queued_longs(rows, device):
    """`rows` (lists of integers, equally long) as one int64 tensor [len(rows), n] on `device`,
    copied as `queued` does."""
    return queued(torch.tensor(rows, dtype=torch.long), device)


def _float(v):
    if isinstance(v, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "-0": -0.0}[v]
    return float(v)


def _axis(a, rank):
    return a + rank if a < 0 else a


def _f32(t):
    return t.float() if t.dtype in HALF else t


# -- leaves -----------------------------------------------------------------------------------


def op_constant(_, a, ctx):
    shape = [ctx.dim(d) for d in a.get("shape", [])]
    vals = [_float(v) for v in a["value"]]
    dt = DTYPES[a.get("dtype", "f32")]
    n = 1
    for s in shape:
        n *= s
    if len(vals) == 1:
        return [torch.full(shape, vals[0], dtype=torch.float64, device=ctx.device).to(dt)]
    if len(vals) != n:
        raise errors.WorkerError(errors.BAD_VALUE, "constant has %d values for shape %s" % (len(vals), shape))
    # Built once per program and shape (ops never write their operands): a host-to-device copy
    # per run would also be one a CUDA graph cannot capture.
    key = (id(a), tuple(shape))
    c = ctx.consts.get(key)
    if c is None:
        c = ctx.consts[key] = torch.tensor(vals, dtype=torch.float64, device=ctx.device).reshape(shape).to(dt)
    return [c]


def op_iota(_, a, ctx):
    shape = [ctx.dim(d) for d in a["shape"]]
    axis = _axis(a.get("axis", 0), len(shape))
    dt = DTYPES[a.get("dtype", "i64")]
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return [torch.arange(shape[axis], device=ctx.device, dtype=torch.float64).reshape(view).expand(shape).to(dt).contiguous()]


def op_random_uniform(_, a, ctx):
    shape = [ctx.dim(d) for d in a["shape"]]
    dt = DTYPES[a.get("dtype", "f32")]
    below_one = {torch.float32: 1 - 2 ** -24, torch.float16: 1 - 2 ** -11, torch.bfloat16: 1 - 2 ** -8}.get(dt, 1 - 2 ** -53)
    # Clamped in f64 to the largest value below 1 of the dtype, so rounding cannot reach 1.
    return [torch.rand(shape, generator=ctx.generator, device=ctx.device, dtype=torch.float64).clamp_max(below_one).to(dt)]


# -- element-wise -----------------------------------------------------------------------------


def _binary(f):
    return lambda x, a, ctx: [f(x[0], x[1])]


def _unary(f):
    return lambda x, a, ctx: [f(x[0])]


def op_gelu(x, a, ctx):
    if a.get("approximate", "none") == "tanh":
        return [F.gelu(x[0], approximate="tanh")]
    return [F.gelu(x[0])]


def op_cast(x, a, ctx):
    dt = DTYPES[a["dtype"]]
    t = x[0]
    if dt == torch.bool:
        return [t != 0]
    if not dt.is_floating_point and t.dtype.is_floating_point:
        # Truncate toward zero, then wrap (the interpreter's integer semantics).
        d = t.double()
        wide = torch.where(torch.isfinite(d), torch.trunc(d), torch.zeros_like(d)).to(torch.int64)
        return [wide.to(dt)]
    return [t.to(dt)]


def op_div(x, a, ctx):
    return [torch.div(x[0], x[1])]


def op_rsqrt(x, a, ctx):
    return [torch.rsqrt(x[0])]


# -- linear algebra ---------------------------------------------------------------------------


def op_matmul(x, a, ctx):
    l, r = x
    if a.get("transposeA", False):
        l = l.transpose(-1, -2)
    if a.get("transposeB", False):
        r = r.transpose(-1, -2)
    return [torch.matmul(l, r)]


def op_linear(x, a, ctx):
    bias = x[2] if len(x) > 2 else None
    return [F.linear(x[0], x[1], bias)]


def _unpack_codes(packed, bits, n):
    """Codes of a packed u8 row tensor [..., bytes] (bits 8: one per byte; 4: low nibble first), first n."""
    d = packed.to(torch.int32)
    if bits == 8:
        return d[..., :n]
    codes = torch.stack([d & 0x0F, d >> 4], dim=-1).reshape(*d.shape[:-1], -1)
    return codes[..., :n]


def op_quantized_linear(x, a, ctx):
    """y = x . dequantize(q)^T in onnxruntime's MatMulNBits layout (see the IR op quantizedLinear)."""
    inp, q, scales = x[0], x[1], x[2]
    zp = x[3] if len(x) > 3 else None
    bits = int(a.get("bits", 8))
    block = int(a["blockSize"])
    in_features = int(a["inFeatures"])
    out_f, blocks = int(q.shape[0]), int(q.shape[1])
    codes = _unpack_codes(q, bits, block)
    if zp is None:
        z = torch.full((out_f, blocks), 2 ** (bits - 1), dtype=torch.int32, device=q.device)
    else:
        z = _unpack_codes(zp, bits, blocks)
    w = (codes - z.unsqueeze(-1)).to(scales.dtype) * scales.unsqueeze(-1)
    w = w.reshape(out_f, blocks * block)[:, :in_features]
    return [F.linear(inp, w.to(inp.dtype))]


def op_grouped_matmul(x, a, ctx):
    inp, w, groups = x
    if a.get("transposeW", False):
        w = w.transpose(-1, -2)
    out = torch.zeros(inp.shape[0], w.shape[2], dtype=inp.dtype, device=inp.device)
    g = groups.long()
    if g.numel() > 0 and (int(g.min()) < 0 or int(g.max()) >= w.shape[0]):
        raise errors.WorkerError(errors.EVAL, "groupedMatmul: a group index is out of range [0, %d)" % w.shape[0])
    for e in torch.unique(g).tolist():
        rows = (g == e).nonzero(as_tuple=True)[0]
        out.index_copy_(0, rows, torch.matmul(inp.index_select(0, rows), w[e]))
    return [out]


# -- reductions and norms ---------------------------------------------------------------------


def _axes(a, rank):
    axes = a.get("axes", [])
    return list(range(rank)) if len(axes) == 0 else [_axis(v, rank) for v in axes]


def op_sum(x, a, ctx):
    t = x[0]
    if t.dim() == 0:
        return [t.clone()]
    return [torch.sum(_f32(t), dim=_axes(a, t.dim()), keepdim=a.get("keepDims", False))]


def op_mean(x, a, ctx):
    t = x[0]
    if t.dim() == 0:
        return [t.clone()]
    src = _f32(t) if t.dtype.is_floating_point else t.double()
    return [torch.mean(src, dim=_axes(a, t.dim()), keepdim=a.get("keepDims", False))]


def op_max(x, a, ctx):
    t = x[0]
    if t.dim() == 0:
        return [t.clone()]
    out = t
    for ax in sorted(_axes(a, t.dim()), reverse=True):
        out = torch.amax(out, dim=ax, keepdim=a.get("keepDims", False))
    return [out]


def op_argmax(x, a, ctx):
    t = x[0]
    if t.dim() == 0:
        return [torch.zeros((), dtype=torch.int64, device=t.device)]
    ax = _axis(a.get("axis", -1), t.dim())
    src = t
    if t.dtype.is_floating_point:
        # NaN counts as the maximum: map it to +inf past every finite value and +inf itself.
        src = torch.where(torch.isnan(t), torch.full_like(t, math.inf), t)
        nan_first = torch.isnan(t).any(dim=ax, keepdim=True)
        idx_nan = torch.isnan(t).to(torch.int8).argmax(dim=ax, keepdim=True)
        idx = src.argmax(dim=ax, keepdim=True)
        res = torch.where(nan_first, idx_nan, idx)
        return [res if a.get("keepDims", False) else res.squeeze(ax)]
    return [src.argmax(dim=ax, keepdim=a.get("keepDims", False))]


def argmax_rows(t):
    """Per row (all but the last axis), the index of the maximum over the last axis as the host's
    pickers take it (`argmaxOf`, runtime `argmaxRows`): the first entry no later entry exceeds, so
    a NaN never wins unless it comes first. int64, on the tensor's device."""
    if t.dim() == 0 or t.shape[-1] == 0:
        return torch.zeros(t.shape[:-1] if t.dim() else (), dtype=torch.int64, device=t.device)
    nan = torch.isnan(t)
    idx = torch.where(nan, torch.full_like(t, -math.inf), t).argmax(dim=-1)
    return torch.where(nan[..., 0], torch.zeros_like(idx), idx)


# Rows drawn together by `sample_rows`: its float64 temporaries stay near 2**22 elements (32 MB
# each) whatever the batch and vocabulary (64 rows of a 128,256-token vocabulary: four chunks).
SAMPLE_CHUNK_ELEMENTS = 1 << 22


def sample_rows(t, temperature, top_k, top_p, u, processing=None):
    """Per row (all but the last axis), one token drawn from the last axis as the host's sampler
    draws it (`samplePick` of @stageml/models), from the f32 values the host would have read: rows
    with temperature 0 take `argmax_rows`; the others order the tokens by value (largest first, ties
    the lowest index), take exp(v / T - v0 / T) in float64 over the top_k largest (0: all), keep the
    fewest whose share reaches top_p (1: all; at least one) and pick the first token whose running
    sum exceeds u of the kept mass. Every sum is a cumulative sum in the host's order, subtraction
    included (x - p == x + (-p) exactly), so on the CPU the picks are the host's wherever exp
    rounds alike; on CUDA the scans may round differently and move a draw that lands within an
    ulp of a boundary. The lists have one entry per row; int64 picks on the tensor's device. Rows
    are drawn in chunks of about SAMPLE_CHUNK_ELEMENTS values (each row's arithmetic is its own).
    `processing` (one entry per row, None for none) is each row's logits processing, applied first
    in float64 as the host's `processLogits` applies it (`process_row`); greedy rows then take the
    processed values' argmax."""
    v = t.shape[-1] if t.dim() else 1
    lead = t.shape[:-1] if t.dim() else ()
    x = t.reshape(-1, v).to(torch.float32)
    rows = x.shape[0]
    if not all(len(a) == rows for a in (temperature, top_k, top_p, u)):
        raise ValueError("sample needs one entry per row (%d rows), got %s" % (rows, [len(a) for a in (temperature, top_k, top_p, u)]))
    if rows == 0 or v == 0:
        return torch.zeros(lead, dtype=torch.int64, device=t.device)
    if processing is not None and any(processing):
        if len(processing) != rows:
            raise ValueError("sample processing needs one entry per row (%d rows), got %d" % (rows, len(processing)))
        x = x.to(torch.float64)
        for r, p in enumerate(processing):
            if p:
                process_row(x[r], p)
    picks = argmax_rows(x)
    if all(tt == 0 for tt in temperature):
        return picks.reshape(lead)
    step = max(1, SAMPLE_CHUNK_ELEMENTS // v)
    parts = [_sample_chunk(x[r:r + step], temperature[r:r + step], top_k[r:r + step], top_p[r:r + step], u[r:r + step], picks[r:r + step]) for r in range(0, rows, step)]
    return (parts[0] if len(parts) == 1 else torch.cat(parts)).reshape(lead)


def process_row(row, p):
    """A row's logits processing in place (float64), in the host's order (`processLogits` of
    @stageml/models): logitBias added; with repetitionPenalty (not 1) each seen token's positive value
    divided by it, a negative one multiplied; each counted token less frequencyPenalty × count, then
    less presencePenalty. Ids past the row are skipped; ids are distinct within each list."""
    v = row.shape[0]
    dev = row.device
    f64 = torch.float64
    bias = [(int(i), float(b)) for i, b in p.get("logitBias") or [] if i < v]
    if bias:
        idx = torch.tensor([i for i, _ in bias], dtype=torch.int64, device=dev)
        row[idx] = row[idx] + torch.tensor([b for _, b in bias], dtype=f64, device=dev)
    rep = p.get("repetitionPenalty", 1)
    seen = [int(i) for i in p.get("seen") or [] if i < v]
    if rep != 1 and seen:
        idx = torch.tensor(seen, dtype=torch.int64, device=dev)
        y = row[idx]
        row[idx] = torch.where(y > 0, y / rep, y * rep)
    counts = [(int(i), int(c)) for i, c in p.get("counts") or [] if i < v]
    if counts:
        idx = torch.tensor([i for i, _ in counts], dtype=torch.int64, device=dev)
        c = torch.tensor([c for _, c in counts], dtype=f64, device=dev)
        row[idx] = row[idx] - float(p.get("frequencyPenalty", 0)) * c - float(p.get("presencePenalty", 0))


def _descending(x, top_k, temperature):
    """Each row of x's values largest first (ties the lowest index) and their indices: every
    column (a stable sort), or, where every sampled row keeps few (0 < k, k * 16 < V, as the host's
    `topOrder` decides), only the first columns that hold them: the entries at or above each row's
    k-th largest value (its ties included) taken in index order and sorted stably, so the columns a
    row keeps are those of the full order. Falls back to the full sort where ties at a row's k-th
    value make the candidates many. Greedy rows (temperature 0) are not read."""
    rows, v = x.shape
    sampled = [kk for kk, tt in zip(top_k, temperature) if tt != 0]
    if sampled and all(0 < kk and kk * 16 < v for kk in sampled):
        kmax = max(sampled)
        top = torch.topk(x, kmax, dim=1).values
        kk = torch.tensor([kk if tt != 0 else kmax for kk, tt in zip(top_k, temperature)], dtype=torch.int64, device=x.device)
        cand = x >= top.gather(1, (kk - 1)[:, None])
        counts = cand.sum(dim=1)
        width = int(counts.max())
        # (a NaN among a row's largest leaves it fewer candidates than its k: the full sort then)
        if width <= 4 * kmax + 64 and bool((counts >= kk).all()):
            # the candidates' positions in index order: the largest keys V - position first
            key = torch.where(cand, v - torch.arange(v, device=x.device)[None, :], torch.zeros((), dtype=torch.int64, device=x.device))
            at = torch.topk(key, width, dim=1).indices
            vals = torch.where(cand.gather(1, at), x.gather(1, at), torch.full((), -math.inf, dtype=x.dtype, device=x.device))
            vals, order = torch.sort(vals, dim=1, descending=True, stable=True)
            return vals, at.gather(1, order)
    return torch.sort(x, dim=-1, descending=True, stable=True)


def _sample_chunk(x, temperature, top_k, top_p, u, picks):
    """`sample_rows` over the rows of x [rows, V] (f32, or f64 once processed; `picks`: their argmax)."""
    v = x.shape[1]
    dev = x.device
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=dev)
    temp = torch.tensor(temperature, dtype=f64, device=dev)
    greedy = temp == 0
    pos = torch.arange(v, device=dev)[None, :]
    k = torch.tensor([v if kk == 0 or kk > v else kk for kk in top_k], dtype=torch.int64, device=dev)[:, None]
    p_top = torch.tensor(top_p, dtype=f64, device=dev)[:, None]
    vals, idx = _descending(x, top_k, temperature)
    # the columns kept: every sampled row's k of them (greedy rows' k clamped, never read)
    v = vals.shape[1]
    pos = pos[:, :v]
    k = k.clamp(max=v)
    # probs = exp(v / T - v0 / T), the host's operations in its order, in place in one buffer
    probs = vals.to(f64).div_(torch.where(greedy, torch.ones_like(temp), temp)[:, None])
    del vals
    probs.sub_(probs[:, :1].clone()).exp_()
    inside = pos < k
    probs = torch.where(inside, probs, zero)
    csum = torch.cumsum(probs, dim=1)
    hit = torch.cumsum(probs / csum[:, -1:], dim=1) >= p_top
    hit &= inside & (p_top < 1)
    keep = torch.where(hit.any(dim=1), hit.to(torch.int8).argmax(dim=1) + 1, k[:, 0])
    del hit
    mass = csum.gather(1, (keep - 1)[:, None])
    del csum
    kept = pos < keep[:, None]
    left = torch.cat([torch.tensor(u, dtype=f64, device=dev)[:, None] * mass, torch.where(kept, probs, zero).neg_()], dim=1)
    del probs
    under = (left.cumsum_(1)[:, 1:] < 0) & kept
    at = torch.where(under.any(dim=1), under.to(torch.int8).argmax(dim=1), keep - 1)
    return torch.where(greedy, picks, idx.gather(1, at[:, None])[:, 0])


def op_softmax(x, a, ctx):
    t = x[0]
    return [torch.softmax(_f32(t), dim=_axis(a.get("axis", -1), t.dim()))]


def op_rms_norm(x, a, ctx):
    t = _f32(x[0])
    y = t * torch.rsqrt(t.pow(2).mean(dim=-1, keepdim=True) + a.get("eps", 1e-6))
    if len(x) > 1:
        y = y * _f32(x[1])
    return [y]


def op_layer_norm(x, a, ctx):
    t = _f32(x[0])
    w = _f32(x[1]) if len(x) > 1 else None
    b = _f32(x[2]) if len(x) > 2 else None
    return [F.layer_norm(t, (t.shape[-1],), w, b, a.get("eps", 1e-5))]


# -- shapes and indexing ----------------------------------------------------------------------


def op_reshape(x, a, ctx):
    return [x[0].reshape([ctx.dim(d) for d in a["shape"]])]


def op_transpose(x, a, ctx):
    return [x[0].permute(a["perm"])]


def op_broadcast_to(x, a, ctx):
    return [x[0].expand([ctx.dim(d) for d in a["shape"]])]


def op_concat(x, a, ctx):
    return [torch.cat(list(x), dim=_axis(a["axis"], x[0].dim()))]


class Tail:
    """A staged cache buffer of the worker (worker.py `Staged`): `phys` the contiguous storage,
    `axis` its position axis, `length` the positions the current run's view of it holds (every
    row's filled positions lie below; from `length` to the end of `phys` nothing is live during
    the run), `pad` the stream's pad, `written` the positions [start, start + n) a run appended in
    place (the worker puts the pad back there before it commits)."""

    __slots__ = ("phys", "axis", "length", "pad", "written", "appends", "__weakref__")

    def __init__(self, phys, axis, pad):
        self.phys, self.axis, self.pad = phys, axis, pad
        self.length = -1
        self.written = None
        self.appends = 0  # runs that appended in place (eager and captured runs; replays run no Python)


# The staged buffers whose positions past a run's view may take the step's keys in place, by the
# address of their first element (the worker registers them; an entry lives as long as its staged
# batch). Not by storage: the streams of one item shape share one allocation (worker.py `Staged`).
CACHE_TAILS = weakref.WeakValueDictionary()


def append_in_place(past, new, ax, ctx):
    """concat([past, new], ax) without copying `past`: where `past` is a whole run's view of a
    staged cache buffer (any permutation of it, `ax` its position axis), `new` is written into the
    buffer's next positions and the view is extended over them. None where that does not hold
    (then the caller concatenates): another storage, a narrowed or converted view, no room left,
    or this buffer's tail already taken in this run."""
    if not CACHE_TAILS or past.dim() != new.dim() or past.dtype != new.dtype or past.device != new.device:
        return None
    tail = CACHE_TAILS.get(past.data_ptr())
    if tail is None:
        return None
    phys, n = tail.phys, new.shape[ax]
    key = ("tail", id(tail))
    if key in ctx.memo or n == 0 or past.shape[ax] != tail.length or tail.length + n > phys.shape[tail.axis]:
        return None
    if past.storage_offset() != phys.storage_offset() or past.stride(ax) != phys.stride(tail.axis) or sorted(past.stride()) != sorted(phys.stride()):
        return None
    if past.dim() != phys.dim() or any(past.shape[d] != new.shape[d] for d in range(past.dim()) if d != ax):
        return None
    size = list(past.shape)
    size[ax] += n
    if min(size) == 0 or sum((s - 1) * st for s, st in zip(size, past.stride())) >= phys.numel():
        return None
    ext = past.as_strided(size, past.stride(), past.storage_offset())
    ext.narrow(ax, tail.length, n).copy_(new)
    ctx.memo[key] = True
    tail.written = (tail.length, n)
    tail.appends += 1
    return ext


def op_slice(x, a, ctx):
    t = x[0]
    ax = _axis(a["axis"], t.dim())
    start = ctx.dim(a.get("start", 0))
    end = ctx.dim(a["end"]) if "end" in a else None
    idx = [slice(None)] * ax + [slice(start, end, a.get("step", 1))]
    return [t[tuple(idx)]]


# Set by cudagraph.py: CAPTURING while a CUDA graph is captured (no host reads then: the index
# checks move to the host before each replay); INDEX_WATCH (data_ptr -> input name, seen list)
# while an eager run records which inputs reach an index check, with which bound.
CAPTURING = [False]
INDEX_WATCH = [None]


def _index(idx, size, op, ctx=None):
    """idx as int64, checked to lie in [0, size) (`RT_EVAL_FAILED` otherwise). The check reads the index's
    bounds on the host, which on a GPU waits for the device: once per run for each index tensor
    (memoized in the run's context, keyed by its storage and layout, the tensor held there so that
    no other tensor takes its memory during the run). An eager prefill of a program with slot
    tables gathers the same slot index for every projection (224 gathers a step of a 16-layer
    model): unmemoized, 448 host waits, each stalling the ops queued behind it."""
    i = idx.long()
    w = INDEX_WATCH[0]
    if w is not None and i.numel() > 0 and idx.data_ptr() in w[0]:
        w[1].append((w[0][idx.data_ptr()], size))
    if CAPTURING[0] or i.numel() == 0:
        return i
    memo = None if ctx is None else ctx.memo
    key = ("index bounds", idx.data_ptr(), tuple(idx.shape), tuple(idx.stride()), idx.dtype, idx.device)
    hit = None if memo is None else memo.get(key)
    if hit is None or hit[0] is not idx:
        # From the host tensor an input was copied from, else one read of both bounds.
        src = host_of(idx, ctx)
        lo, hi = (src.min().item(), src.max().item()) if src is not None else torch.stack([i.min(), i.max()]).tolist()
        hit = (idx, lo, hi)
        if memo is not None:
            memo[key] = hit
    if hit[1] < 0 or hit[2] >= size:
        raise errors.WorkerError(errors.EVAL, "%s: an index is out of range [0, %d)" % (op, size))
    return i


def op_gather(x, a, ctx):
    table, idx = x
    ax = _axis(a.get("axis", 0), table.dim())
    i = _index(idx, table.shape[ax], "gather", ctx)
    flat = torch.index_select(table, ax, i.reshape(-1))
    return [flat.reshape(list(table.shape[:ax]) + list(idx.shape) + list(table.shape[ax + 1 :]))]


def op_index_select(x, a, ctx):
    t, idx = x
    ax = _axis(a.get("axis", 0), t.dim())
    return [torch.index_select(t, ax, _index(idx, t.shape[ax], "indexSelect", ctx))]


def op_scatter_add(x, a, ctx):
    t, idx, up = x
    ax = _axis(a.get("axis", 0), t.dim())
    i = _index(idx, t.shape[ax], "scatterAdd", ctx)
    if t.dtype in HALF:
        return [_f32(t).index_add(ax, i, _f32(up))]
    return [t.index_add(ax, i, up)]


def op_where(x, a, ctx):
    return [torch.where(x[0].bool(), x[1], x[2])]


def op_topk(x, a, ctx):
    t = x[0]
    ax = _axis(a.get("axis", -1), t.dim())
    largest = a.get("largest", True)
    vals, idx = torch.sort(t, dim=ax, descending=largest, stable=True)
    k = a["k"]
    return [vals.narrow(ax, 0, k), idx.narrow(ax, 0, k)]


# -- transformer ops --------------------------------------------------------------------------


def op_rotary(x, a, ctx):
    t, c, s = x
    if a.get("interleaved", False):
        ev, od = t[..., 0::2], t[..., 1::2]
        rot = torch.stack((-od, ev), dim=-1).flatten(-2)
    else:
        h = t.shape[-1] // 2
        rot = torch.cat((-t[..., h:], t[..., :h]), dim=-1)
    if t.dtype in HALF:
        return [_f32(t) * _f32(c) + _f32(rot) * _f32(s)]
    return [t * c + rot * s]


def host_of(t, ctx):
    """`t`'s values on the host where `t` is an input the run copied from the host (graph.Program.run),
    or a contiguous reshape of one (the same memory, the same elements in the same order); else None."""
    entry = None if ctx is None or t.numel() == 0 else ctx.host.get(t.data_ptr())
    if entry is None:
        return None
    dev, src = entry
    if dev is t:
        return src
    if dev.numel() == t.numel() and dev.dtype == t.dtype and dev.is_contiguous() and t.is_contiguous():
        return src.reshape(t.shape)
    return None


def _all_zero(mask, ctx):
    """Whether a float mask is all zeros (no key masked), memoized per run for the tensor (held in
    the memo, so that no other tensor takes its memory during the run); read from the host tensor
    an input mask was copied from, else from the device (a wait for it)."""
    if CAPTURING[0]:
        return False  # (a graph is replayed with other masks: the general, masked path)
    key = ("all zero", mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()), mask.dtype)
    hit = ctx.memo.get(key)
    if hit is None or hit[0] is not mask:
        src = host_of(mask, ctx)
        hit = (mask, not bool(((src if src is not None else mask) != 0).any()))
        ctx.memo[key] = hit
    return hit[1]


#: Rows from which a graphed decode step's attention may use SDPA's cuDNN backend (op_attention).
CUDNN_MIN_ROWS = 8


def _cudnn_sdp_on():
    f = getattr(torch.backends.cuda, "cudnn_sdp_enabled", None)
    return bool(f()) if f is not None else False


def folded_gqa_decode(q, k, v, am, scale=None):
    """SDPA of one query row per head, q [b, hq, 1, d], over k, v [b, hkv, tk, d] (hq a multiple of
    hkv) with the float mask am [b, hq, 1, tk]: the `hq / hkv` query heads of each key head as that
    head's query rows, so no key is repeated (op_attention; bench/gpu/serve/attention_probe.py
    times it against the other paths)."""
    b, hq, _, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    group = hq // hkv
    qf = q.reshape(b, hkv, group, d)
    mf = am.reshape(b, hkv, group, tk)
    return F.scaled_dot_product_attention(qf, k, v, attn_mask=mf, scale=scale).reshape(q.shape)


def op_attention(x, a, ctx):
    q, k, v = x[0], x[1], x[2]
    mask = x[3] if len(x) > 3 else None
    hq, tq, d = q.shape[-3], q.shape[-2], q.shape[-1]
    hkv, tk = k.shape[-3], k.shape[-2]
    group = hq // hkv
    scale = a.get("scale")
    scale = d ** -0.5 if scale is None else _float(scale)
    causal = a.get("causal", False)
    if _SDPA and q.device.type == "cuda" and q.dtype in HALF and mask is not None and mask.dtype != torch.bool and _all_zero(mask, ctx) and (tq == 1 or (tq == tk and causal)):
        # What transformers' sdpa attention calls when no key is masked (its mask is then None):
        # is_causal for a prompt without a past, nothing for one query row, GQA inside SDPA. The
        # same call, so the same kernel (flash) and the same bits.
        try:
            return [F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal and tq > 1, enable_gqa=True)]
        except TypeError:  # torch < 2.5: no enable_gqa
            pass
    bias = None
    if mask is not None:
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=q.device).masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else _f32(mask)
    if causal:
        i = torch.arange(tq, device=q.device).reshape(tq, 1)
        j = torch.arange(tk, device=q.device).reshape(1, tk)
        cm = torch.zeros((tq, tk), dtype=torch.float32, device=q.device).masked_fill(j > i + (tk - tq), -math.inf)
        bias = cm if bias is None else bias + cm
    if _SDPA and q.device.type == "cuda":
        am = None if bias is None else bias.to(q.dtype).expand(list(q.shape[:-1]) + [tk])
        if group > 1 and am is not None and tq == 1 and q.dim() == 4 and k.dim() == 4 and q.shape[0] < CUDNN_MIN_ROWS:
            # A decode step of few rows: the query heads of a key head as that head's query rows, so
            # memory-efficient attention takes the mask without repeated keys, and never SDPA's
            # cuDNN backend, whose plan for each new shape took 0.5-0.75 s at 1 row on an H100 to
            # save 0.015 ms a layer (40-75 ms at 8-64 rows, where it saves 0.02-0.04 ms a layer of
            # every step; bench/gpu/serve/attention_probe.py, torch 2.11).
            prev = _cudnn_sdp_on()
            if prev:
                torch.backends.cuda.enable_cudnn_sdp(False)
            try:
                return [folded_gqa_decode(q, k, v, am, scale)]
            except TypeError:  # torch 2.0: no scale argument
                pass
            finally:
                if prev:
                    torch.backends.cuda.enable_cudnn_sdp(True)
        if group > 1 and am is not None and not _cudnn_sdp_on():
            # With a mask, SDPA takes enable_gqa only in its math backend (flash and memory-efficient
            # attention want as many key heads as query heads): 2.09 ms a layer for a 64-row prefill
            # chunk of the 1B shape on an H100, 0.38 ms with the key heads repeated first
            # (bench/gpu/serve/attention_probe.py, torch 2.11), as transformers' sdpa attention does
            # when given a mask. cuDNN's backend (on inside a CUDA graph's capture) takes grouped heads.
            k = k.repeat_interleave(group, dim=-3)
            v = v.repeat_interleave(group, dim=-3)
            group = 1
        if group > 1:
            try:
                return [F.scaled_dot_product_attention(q, k, v, attn_mask=am, scale=scale, enable_gqa=True)]
            except TypeError:  # torch < 2.5: no enable_gqa
                k = k.repeat_interleave(group, dim=-3)
                v = v.repeat_interleave(group, dim=-3)
        try:
            return [F.scaled_dot_product_attention(q, k, v, attn_mask=am, scale=scale)]
        except TypeError:  # torch 2.0: no scale argument
            return [F.scaled_dot_product_attention(q * (scale * math.sqrt(d)), k, v, attn_mask=am)]
    if group > 1:
        k = k.repeat_interleave(group, dim=-3)
        v = v.repeat_interleave(group, dim=-3)
    scores = torch.matmul(_f32(q), _f32(k).transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    return [torch.matmul(torch.softmax(scores, dim=-1), _f32(v))]


def run_op(ctx, dtype, key, args, attrs):
    """One registry op of OPS as graph.Program runs a step: half operands widened to f32 off CUDA (and
    for the ops CUDA does not run in half), a float result rounded to `dtype`."""
    if not (ctx.device.type == "cuda" and key in NATIVE_HALF_ON_CUDA):
        args = [a.float() if a.dtype in HALF else a for a in args]
    y = OPS[key](args, attrs, ctx)[0]
    return y if y.dtype == dtype or not y.is_floating_point() else y.to(dtype)


def lora_bank_update(x, base, a, b, index, select, form, ctx):
    """base + the update, as `loraBank`'s decomposition computes it (packages/ir/src/ops/serving.ts
    `decomposeLoraBank`), op by op, each result rounded to x's dtype."""
    dt = x.dtype

    def op(key, args, **attrs):
        return run_op(ctx, dt, key, args, attrs)

    if form == "single":
        shrink = op("mul", [op("linear", [x, op("gather", [a, index], axis=0)]), select])
        update = op("matmul", [shrink, op("gather", [b, index], axis=0)])
    elif form == "gathered":
        shrink = op("matmul", [x, op("gather", [a, index], axis=0)], transposeB=True)
        update = op("matmul", [shrink, op("gather", [b, index], axis=0)])
    else:
        rows, seq, k = x.shape
        groups, rank, n = index.shape[0], a.shape[1], b.shape[2]
        onehot = op("reshape", [select], shape=[rows, 1, groups, 1])
        a_flat = op("reshape", [op("gather", [a, index], axis=0)], shape=[-1, k])
        shrink = op("reshape", [op("linear", [x, a_flat])], shape=[rows, seq, groups, rank])
        own = op("reshape", [op("mul", [shrink, onehot])], shape=[rows, seq, -1])
        update = op("matmul", [own, op("reshape", [op("gather", [b, index], axis=0)], shape=[-1, n])])
    return op("add", [base, update])


def op_lora_bank(x, a, ctx):
    """The `loraBank` entry of ops.OPS: operands x, base, A, B, index[, select] as stored (the step
    is in graph.RAW_OPERANDS; each op widens what it must)."""
    xs, base, at, bt, index = x[:5]
    select = x[5] if len(x) > 5 else None
    return [lora_bank_update(xs, base, at, bt, index, select, a.get("form", "gathered"), ctx)]


def op_lora_bank_linear(x, a, ctx):
    """The `loraBankLinear` entry of ops.OPS (packages/ir/src/ops/serving-fused.ts): its
    decomposition, the base linear (rounded to x's dtype) then `op_lora_bank`'s ops. Operands x, W,
    A, B, index[, select][, bias] as stored (the step is in graph.RAW_OPERANDS)."""
    form = a.get("form", "gathered")
    n = 5 if form == "gathered" else 6
    xs, w, at, bt, index = x[:5]
    select = x[5] if n == 6 else None
    base = run_op(ctx, xs.dtype, "linear", [xs, w] + list(x[n:n + 1]), {})
    return [lora_bank_update(xs, base, at, bt, index, select, form, ctx)]


def op_lora_linear(x, a, ctx):
    """The `loraLinear` entry of ops.OPS (packages/ir/src/ops/serving.ts): x.w^T + bias +
    s.((x.A^T).B^T + bias_B) as its decomposition computes it, op by op, each result rounded to x's
    dtype (the scale a scalar of that dtype). Operands x, w, A, B[, bias][, bias_B] as stored (the
    step is in graph.RAW_OPERANDS); the attribute loraBias says a lone fifth operand is bias_B."""
    xs, w, at, bt = x[:4]
    extra = list(x[4:])
    bias_b = [extra.pop()] if a.get("loraBias", False) else []
    dt = xs.dtype

    def op(key, args, **attrs):
        return run_op(ctx, dt, key, args, attrs)

    scale = torch.tensor(float(a["scale"]), dtype=dt, device=xs.device)
    delta = op("mul", [op("linear", [op("linear", [xs, at]), bt] + bias_b), scale])
    return [op("add", [op("linear", [xs, w] + extra), delta])]


def _join_cache(past, new, ax, ctx):
    """concat([past, new], ax): `new` appended in place after a staged cache's view where the
    buffer allows (append_in_place), else a copy."""
    ext = append_in_place(past, new, ax, ctx)
    return ext if ext is not None else torch.cat([past, new], dim=ax)


def op_cached_attention(x, a, ctx):
    """`cachedAttention` (packages/ir/src/ops/serving.ts): the position-major cache pastK/pastV
    [..., past, h, d] seen head-major (a view), the step's keys and values appended to it in place
    where it is a staged buffer of the worker (worker.py `Staged`), and `op_attention` over the
    result (SDPA on CUDA). Operands q, pastK, pastV, k, v[, mask]."""
    q, pk, pv, k, v = x[:5]
    r = k.dim()
    perm = list(range(r - 3)) + [r - 2, r - 3, r - 1]
    keys = _join_cache(pk.permute(perm), k, r - 2, ctx)
    values = _join_cache(pv.permute(perm), v, r - 2, ctx)
    return op_attention([q, keys, values] + list(x[5:6]), a, ctx)


# The worker's op table: a handler per registry op, the serving ops (`loraBank`, `loraLinear`, `cachedAttention`)
# and the other composites the worker runs itself included (`TORCH_WORKER_COMPOSITES` on the
# TypeScript side lists them; any other composite arrives expanded into its decomposition, so an op
# registered with only a `decompose` needs nothing here). packages/runtime/src/torch/op-table.test.ts
# keeps the two in step. Where a kernel takes a step (bank.bind_kernels: `loraBankLinear`, by its
# name), graph.Program replaces the entry's function for that step when it prepares a program.
OPS = {
    "constant": op_constant,
    "iota": op_iota,
    "randomUniform": op_random_uniform,
    "add": _binary(torch.add),
    "sub": _binary(torch.sub),
    "mul": _binary(torch.mul),
    "div": op_div,
    "pow": _binary(torch.pow),
    "maximum": _binary(torch.maximum),
    "minimum": _binary(torch.minimum),
    "neg": _unary(torch.neg),
    "abs": _unary(torch.abs),
    "exp": _unary(torch.exp),
    "log": _unary(torch.log),
    "sqrt": _unary(torch.sqrt),
    "rsqrt": op_rsqrt,
    "tanh": _unary(torch.tanh),
    "sigmoid": _unary(torch.sigmoid),
    "silu": _unary(F.silu),
    "gelu": op_gelu,
    "sin": _unary(torch.sin),
    "cos": _unary(torch.cos),
    "equal": _binary(torch.eq),
    "notEqual": _binary(torch.ne),
    "less": _binary(torch.lt),
    "lessEqual": _binary(torch.le),
    "greater": _binary(torch.gt),
    "greaterEqual": _binary(torch.ge),
    "where": op_where,
    "cast": op_cast,
    "matmul": op_matmul,
    "linear": op_linear,
    "groupedMatmul": op_grouped_matmul,
    "quantizedLinear": op_quantized_linear,
    "sum": op_sum,
    "mean": op_mean,
    "max": op_max,
    "argmax": op_argmax,
    "softmax": op_softmax,
    "rmsNorm": op_rms_norm,
    "layerNorm": op_layer_norm,
    "reshape": op_reshape,
    "transpose": op_transpose,
    "broadcastTo": op_broadcast_to,
    "concat": op_concat,
    "slice": op_slice,
    "gather": op_gather,
    "indexSelect": op_index_select,
    "scatterAdd": op_scatter_add,
    "topk": op_topk,
    "rotary": op_rotary,
    "attention": op_attention,
    "cachedAttention": op_cached_attention,
    "loraBank": op_lora_bank,
    "loraBankLinear": op_lora_bank_linear,
    "loraLinear": op_lora_linear,
}

# Ops whose operands stay in f16/bf16 on CUDA (tensor cores); on the CPU all half ops compute in f32.
NATIVE_HALF_ON_CUDA = {"matmul", "linear", "groupedMatmul", "attention", "add", "sub", "mul", "gather", "indexSelect", "reshape", "transpose", "concat", "cachedAttention", "slice", "broadcastTo", "silu", "cast", "constant", "where"}
