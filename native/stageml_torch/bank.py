"""The torch worker's bank kernel steps for the IR op `loraBankLinear` (packages/ir/src/ops/
serving-fused.ts): a base linear and per-row low-rank updates drawn from slot tables,
y = x·Wᵀ (+ bias) + Σ_g c[r, g]·(x·A[s_g]ᵀ)·B[s_g], in the forms `gathered` (a slot per row),
`single` (one slot, a 0/1 row mask) and `grouped` (the batch's slots, a one-hot per row).

Two handlers, chosen per step by the op's name when a program is prepared (`bind_kernels`,
graph.Program):

- `ops.op_lora_bank_linear` (the table entry in ops.OPS): the op's decomposition as torch ops (the
  linear, then `loraBank`'s ops), each result rounded to the op's dtype as the expanded graph would
  round it — exactly what the worker ran before the op existed;
- `LoraBankStep`: every bf16/f16 `loraBankLinear` step, whose operands already are x, W, the bias
  and the tables, so that one kernel computes x·Wᵀ and the update together (the engine's graph
  builder emits the op; nothing here looks at what produced an operand) — on CUDA with bf16 the
  multi-adapter bank kernel
  `stream.lora_bank_linear` (one slot per row; ≤ 64 rows, rank ≤ 64 and a multiple of 8, sm_90
  and cupy), and wherever it declines, the linear and then `op_lora_bank`'s ops. `STAGEML_TORCH_FUSE`:
  `auto` (default: on CUDA), `0` (never: `op_lora_bank` everywhere), `1` (also on the CPU; the
  tests stand a reference in for the kernel).

`group_banks` then merges the `LoraBankStep`s of one x (a layer's q, k and v; its gate and up) into
one `BankSetStep` each, placed where the first of them was: on CUDA their base GEMMs run one after
the other beside one shrink and one expand for the whole set (`stream.lora_bank_linear_set`), and
wherever that path declines each member runs as its own `LoraBankStep` (`STAGEML_TORCH_BANK_SETS=0`
keeps them apart). Neither looks at primitive ops: `bind_kernels` reads op names and operand
dtypes, `group_banks` kernel steps and the identity of their operands.

The kernel gets a_bank = A, b_bank_t = B, b_bank = B transposed [S, out, R] and per-slot ranks (the
highest nonzero rank row of A or B, rounded up to 8; 0 for an all-zero slot), derived once per
table tensor (`_derived`: keyed by the tables' identity, checked against their storage and
version, dropped when a table is freed, at most `CACHE_SIZE` entries; one host read of the ranks
per derivation, so tables of equal ranks share one ranks tensor); scales are ones (the engine
folds the scale into B); the slots are one per row of x's [rows·seq, in] rows (each row's slot
repeated seq times; −1, base only, where the slot's rank is 0, the mask is 0, the one-hot row is
all zeros or the index is outside the table), computed on the device without a host sync, once
per step for all projections whose tables share their ranks (memoized in the run's context). A
bias is added after the kernel. The kernel takes the engine's contract for the selects, which it
cannot check without a host sync: in the `single` form a nonzero mask entry counts as 1, in the
`grouped` form a row's first nonzero one-hot entry is its group, weight 1 (the engine sends 0/1
masks and one-hots with at most one 1 per row).

Numerics: the kernel accumulates x·Wᵀ + (x·Aᵀ)·Bᵀ in f32 and rounds once, as the op's reference
semantics do; `op_lora_bank` rounds after each op as the decomposition does.
"""

import collections
import os
import sys
import weakref

import torch

from .ops import lora_bank_update, run_op

#: The IR op whose steps `bind_kernels` gives the kernel (packages/ir/src/ops/serving-fused.ts).
OP_KEY = "loraBankLinear"
#: Key of a step that runs a `loraBankLinear` through the kernel (raw operands: graph.RAW_OPERANDS).
KEY = "loraBankLinear.kernel"
#: Key of a set of those steps of one input (`BankSetStep`; raw operands too).
SET_KEY = "loraBankSet"
#: Most derived table entries kept at once.
CACHE_SIZE = 256
#: Tables derived so far (ranks, B transposed): what the tests read to see the cache work.
DERIVATIONS = 0
MAX_ROWS = 64

_DERIVED = collections.OrderedDict()
# Rank vectors and scales by value, shared by the entries (a handful: one per distinct rank mix).
_SHARED = {}
_STREAM = None


def _stream():
    """The stream module (the bank kernel's host side), or False when it does not import."""
    global _STREAM
    if _STREAM is None:
        try:
            from . import stream

            _STREAM = stream
        except Exception:  # noqa: BLE001 - any import failure means: no kernel, the unfused ops
            _STREAM = False
    return _STREAM


class _Entry:
    __slots__ = ("refs", "stamp", "a_bank", "b_bank", "b_bank_t", "ranks", "scales", "__weakref__")


def _stamp(t):
    return (t.data_ptr(), t._version, tuple(t.shape), t.dtype, t.device)


def _drop(key, entry_ref):
    def cb(_):
        e = entry_ref()
        if e is not None and _DERIVED.get(key) is e:
            del _DERIVED[key]

    return cb


def _derived(a, b):
    """The kernel's view of the tables a [S, R, K], b [S, R, N] (an `_Entry`: b_bank [S, N, R], ranks
    int32 [S], scales f32 [S]; a_bank and b_bank_t contiguous copies, or None for the tables
    themselves): computed once per pair of table tensors."""
    global DERIVATIONS
    key = (id(a), id(b))
    e = _DERIVED.get(key)
    if e is not None and e.refs[0]() is a and e.refs[1]() is b and e.stamp == (_stamp(a), _stamp(b)):
        _DERIVED.move_to_end(key)
        return e
    e = _Entry()
    ref = weakref.ref(e)
    e.refs = (weakref.ref(a, _drop(key, ref)), weakref.ref(b, _drop(key, ref)))
    e.stamp = (_stamp(a), _stamp(b))
    s, r = a.shape[0], a.shape[1]
    nz = (a != 0).any(dim=-1) | (b != 0).any(dim=-1)
    top = (nz.to(torch.int32) * torch.arange(1, r + 1, dtype=torch.int32, device=a.device)).amax(dim=-1)
    ranks = torch.clamp((top + 7) // 8 * 8, max=r).to(torch.int32)
    # One host read per table derivation (not per run): tables of equal ranks share one tensor, so
    # a step's per-row slots are computed once for all of them (`_row_slots`' memo).
    key_r = (tuple(ranks.tolist()), str(a.device))
    e.ranks = _SHARED.get(key_r)
    if e.ranks is None:
        e.ranks = _SHARED[key_r] = ranks.contiguous()
    key_s = (s, str(a.device))
    e.scales = _SHARED.get(key_s)
    if e.scales is None:
        e.scales = _SHARED[key_s] = torch.ones(s, dtype=torch.float32, device=a.device)
    # The tables themselves are not held (a freed table frees its entry): None stands for them.
    e.a_bank = None if a.is_contiguous() else a.contiguous()
    e.b_bank_t = None if b.is_contiguous() else b.contiguous()
    e.b_bank = b.transpose(1, 2).contiguous()
    DERIVATIONS += 1
    _DERIVED[key] = e
    while len(_DERIVED) > CACHE_SIZE:
        _DERIVED.popitem(last=False)
    return e


def _row_slots(slot, ranks, rows_of, seq, on):
    """int32 [batch·seq]: `slot` (i64 [batch]) where `on` (bool [batch], None: every row) and the
    slot's rank is nonzero, else −1; each entry repeated seq times. No host sync."""
    s = ranks.shape[0]
    inside = (slot >= 0) & (slot < s)
    safe = torch.where(inside, slot, torch.zeros_like(slot))
    keep = inside & (ranks.index_select(0, safe.reshape(-1)).reshape(safe.shape) > 0)
    if on is not None:
        keep = keep & on
    out = torch.where(keep, safe, torch.full_like(safe, -1)).to(torch.int32)
    return out.reshape(rows_of, 1).expand(rows_of, seq).reshape(-1).contiguous()




def mode():
    """`STAGEML_TORCH_FUSE`: `auto` (kernel steps on CUDA), `0` (never), `1` (also on the CPU)."""
    v = os.environ.get("STAGEML_TORCH_FUSE", "auto")
    return v if v in ("auto", "0", "1") else "auto"


class LoraBankStep:
    """A `loraBankLinear` step on the kernel: operands x, W, [bias], A, B, index[, select]; the bank
    kernel where it takes the run, else the linear and `op_lora_bank`'s ops."""

    def __init__(self, form, has_bias, dtype):
        self.form = form
        self.has_bias = has_bias
        self.dtype = dtype
        # Runs that reached the kernel, and those it ran (did not decline).
        self.calls = 0
        self.hits = 0

    def __call__(self, args, attrs, ctx):
        y = self._kernel(args, ctx.memo)
        if y is not None:
            return [y]
        return [self._unfused(args, ctx)]

    def _kernel(self, args, memo):
        op = self.kernel_operands(args, memo)
        return None if op is None else self.run_operands(op)

    def run_operands(self, op):
        """The kernel on `kernel_operands`' answer: y, or None where it declines."""
        mod, x, w, bias, a_bank, b_bank, b_bank_t, slots, ranks, scales = op
        self.calls += 1
        y = mod.lora_bank_linear(x, w, a_bank, b_bank, slots, ranks, scales, b_bank_t=b_bank_t)
        if y is None:
            return None
        self.hits += 1
        return y if bias is None else y + bias

    def prime(self, args):
        """Derives now what `kernel_operands` derives once per pair of tables (`_derived`: its one
        host read, which a CUDA graph's capture refuses). `args` as the step's operands, None for
        those the run computes."""
        _, _, _, rest = self._split(args)
        a, b = rest[0], rest[1]
        if a is None or b is None or not (a.is_cuda and b.is_cuda) or a.dim() != 3 or b.dim() != 3 or a.dtype != self.dtype or b.dtype != self.dtype:
            return
        _derived(a, b)

    def _split(self, args):
        x, w = args[0], args[1]
        bias = args[2] if self.has_bias else None
        rest = args[3:] if self.has_bias else args[2:]
        return x, w, bias, rest

    def kernel_operands(self, args, memo):
        """(stream module, x, W, bias, a_bank, b_bank, b_bank_t, slots, ranks, scales) for the
        kernel, or None where it cannot take this run (then the linear and the update's ops run)."""
        x, w, bias, rest = self._split(args)
        a, b = rest[0], rest[1]
        if x.dtype != torch.bfloat16 or not (w.dtype == a.dtype == b.dtype == x.dtype) or x.dim() != 3 or a.dim() != 3 or b.dim() != 3:
            return None
        batch, seq, k = x.shape
        s, r, ka = a.shape
        if batch * seq > MAX_ROWS or batch * seq == 0 or r > 64 or r % 8 != 0 or ka != k or b.shape[:2] != (s, r) or w.shape != (b.shape[2], k):
            return None
        mod = _stream()
        if not mod or not mod.available():
            return None
        if self.form == "gathered":
            slot = rest[2]
            if slot.dim() != 1 or slot.shape[0] != batch or slot.dtype.is_floating_point:
                return None
        elif self.form == "single":
            slot, mask = rest[2], rest[3]
            if slot.dim() != 0 or slot.dtype.is_floating_point or mask.numel() != batch:
                return None
        else:
            slot, onehot = rest[2], rest[3]
            g = slot.shape[0] if slot.dim() == 1 else -1
            if g <= 0 or slot.dtype.is_floating_point or onehot.numel() != batch * g:
                return None
        e = _derived(a, b)
        # The same per-row slots for every projection of the step whose tables have the same ranks.
        key = ("bank_slots", self.form, tuple(id(t) for t in rest[2:]), id(e.ranks), batch, seq)
        slots = memo.get(key)
        if slots is None:
            slots = memo[key] = self._slots(rest[2:], e.ranks, batch, seq)
        a_bank = a if e.a_bank is None else e.a_bank
        b_bank_t = b if e.b_bank_t is None else e.b_bank_t
        return mod, x, w, bias, a_bank, e.b_bank, b_bank_t, slots, e.ranks, e.scales

    def _slots(self, sel, ranks, batch, seq):
        on = None
        if self.form == "gathered":
            slot = sel[0]
        elif self.form == "single":
            on = sel[1].reshape(batch) != 0
            slot = sel[0].reshape(1).expand(batch)
        else:
            groups, onehot = sel
            nz = onehot.reshape(batch, groups.shape[0]) != 0
            on = nz.any(dim=-1)
            # The row's group: its first nonzero entry (the engine's one-hot has one 1 or none).
            slot = groups.index_select(0, nz.to(torch.float32).argmax(dim=-1))
        return _row_slots(slot.to(torch.int64), ranks, batch, seq, on)

    def _unfused(self, args, ctx):
        """The base linear and the update's ops, each as `Program.run` runs it (the op's dtype)."""
        x, w, bias, rest = self._split(args)
        base = run_op(ctx, self.dtype, "linear", [x, w] + ([] if bias is None else [bias]), {})
        select = rest[3] if len(rest) > 3 else None
        return lora_bank_update(x, base, rest[0], rest[1], rest[2], select, self.form, ctx)


class BankSetStep:
    """Slot linears of one input and one row→slot map (a layer's q, k and v; its gate and up) run
    at once through `stream.lora_bank_linear_set`: their base GEMMs one after the other while one
    shrink and one expand for them all run beside them. `members` are their `LoraBankStep`s, `spans`
    where each one's operands lie in the set's; where the set path declines (other row counts, a
    member whose tables or slots differ in kind, no kernel), each member runs as its own step."""

    def __init__(self, members, spans):
        self.members = members
        self.spans = spans
        # Runs that reached the set kernel, and those it ran.
        self.calls = 0
        self.hits = 0

    def prime(self, args):
        """`LoraBankStep.prime` for every member."""
        for m, (a, b) in zip(self.members, self.spans):
            m.prime(args[a:b])

    def __call__(self, args, attrs, ctx):
        parts = [args[a:b] for a, b in self.spans]
        ops = [m.kernel_operands(p, ctx.memo) for m, p in zip(self.members, parts)]
        ys = self._kernel(ops)
        if ys is not None:
            return ys
        # each member alone, on the operands already derived: its kernel, else its linear and update ops
        out = []
        for m, p, o in zip(self.members, parts, ops):
            y = None if o is None else m.run_operands(o)
            out.append(y if y is not None else m._unfused(p, ctx))
        return out

    def _kernel(self, ops):
        if any(o is None for o in ops) or any(o[1] is not ops[0][1] or o[7] is not ops[0][7] for o in ops):
            return None
        mod, x, slots = ops[0][0], ops[0][1], ops[0][7]
        self.calls += 1
        ys = mod.lora_bank_linear_set(x, [(o[2], o[4], o[5], o[8], o[9], o[6]) for o in ops], slots)
        if ys is None:
            return None
        self.hits += 1
        for m in self.members:
            m.calls += 1
            m.hits += 1
        return [y if o[3] is None else y + o[3] for y, o in zip(ys, ops)]


def _defs(steps):
    """The index of the step defining each value."""
    return {v: i for i, (_, _, _, _, ids) in enumerate(steps) for v in ids}


def bind_kernels(steps, value_types, on_cuda):
    """Rewrites `steps` (key, fn, operands, attrs, ids): each `loraBankLinear` step (operands x, W,
    A, B, index[, select][, bias]) in bf16/f16 whose x, W and bias have the op's dtype becomes a
    `LoraBankStep` (operands x, W[, bias], A, B, index[, select]). Reads op names and operand types
    only: the op itself says that its base is x·Wᵀ (+ bias). Under `STAGEML_TORCH_FUSE` (`auto`: on
    CUDA). Returns (steps, count)."""
    m = mode()
    if m == "0" or (m == "auto" and not on_cuda):
        return steps, 0
    out = []
    count = 0
    for key, fn, operands, attrs, ids in steps:
        dt = value_types[ids[0]][1]
        if key != OP_KEY or dt not in ("bf16", "f16"):
            out.append((key, fn, operands, attrs, ids))
            continue
        form = attrs.get("form", "gathered")
        x, w, tables, bias = split_linear_operands(operands, form)
        if any(value_types[v][1] != dt for v in [x, w] + bias):
            out.append((key, fn, operands, attrs, ids))
            continue
        step = LoraBankStep(form, bool(bias), DTYPE_OF[dt])
        out.append((KEY, step, [x, w] + bias + tables, {}, ids))
        count += 1
    return out, count


def split_linear_operands(operands, form):
    """A `loraBankLinear` operand list (x, W, A, B, index[, select][, bias]; `select` in the grouped
    and single forms) as (x, W, [A, B, index[, select]], [bias] or [])."""
    n = 5 if form == "gathered" else 6
    return operands[0], operands[1], list(operands[2:n]), list(operands[n:n + 1])


def kernel_sets(steps, value_types):
    """The bank linears of prepared `steps` by input, as `stream.warm_bank` takes them: [(k, [(n,
    rmax), ...)), ...], each distinct entry once — a `BankSetStep`'s members together, each
    `LoraBankStep` alone (W [n, k] and A [S, rmax, k] read from the operands' declared shapes; bf16
    steps only; steps with a symbolic shape are left out)."""
    out = []

    def member(step, operands):
        if step.dtype != torch.bfloat16:
            return None  # the kernels take bf16 only
        w, a = operands[1], operands[3 if step.has_bias else 2]
        ws, as_ = value_types[w][2], value_types[a][2]
        if len(ws) != 2 or len(as_) != 3 or not all(isinstance(d, int) for d in list(ws) + list(as_)):
            return None
        return ws[1], (ws[0], as_[1])

    for key, fn, operands, _, _ in steps:
        if key == KEY:
            got = [member(fn, operands)]
        elif key == SET_KEY:
            got = [member(m, operands[a:b]) for m, (a, b) in zip(fn.members, fn.spans)]
        else:
            continue
        if got and all(g is not None for g in got) and len({g[0] for g in got}) == 1:
            entry = (got[0][0], tuple(g[1] for g in got))
            if entry not in out:
                out.append(entry)
    return out


_WARMED = set()


def warm(steps, value_types, device):
    """Builds the bank kernels `steps` can reach before their first run (`stream.warm_bank`), once
    per process for each distinct set of shapes; on CUDA only. Returns the runs made (0: nothing to
    build, already built, or no kernel here)."""
    if torch.device(device).type != "cuda":
        return 0
    sets = kernel_sets(steps, value_types)
    key = (str(device), tuple(sets))
    if not sets or key in _WARMED:
        return 0
    mod = _stream()
    if not mod or not mod.available():
        return 0
    _WARMED.add(key)
    try:
        return mod.warm_bank(device, sets)
    except Exception as ex:  # noqa: BLE001 - an optimisation: each kernel is then built at its first launch, as without it
        sys.stderr.write("stageml_torch: building the bank kernels ahead failed (%s: %s); they are built at first use\n" % (type(ex).__name__, ex))
        return 0


#: torch dtypes of the op dtypes a `LoraBankStep` takes.
DTYPE_OF = {"bf16": torch.bfloat16, "f16": torch.float16}


def group_banks(steps, outputs, most=4):  # most: tma.SET_MAX, the projections one BankSet launch takes
    """Rewrites `steps` after `bind_kernels`, merging the `LoraBankStep`s that read one x into
    `BankSetStep`s of at most `most` members, each placed where its first member was (every
    member's operands are defined before that point; those that are not stay alone). Returns
    (steps, sets)."""
    defs = _defs(steps)
    by_x = collections.OrderedDict()
    for i, (key, _, operands, _, _) in enumerate(steps):
        if key == KEY:
            by_x.setdefault(operands[0], []).append(i)
    place = {}
    drop = set()
    count = 0
    for idxs in by_x.values():
        first = idxs[0]
        members = [i for i in idxs if all(defs.get(v, -1) < first for v in steps[i][2])]
        for c in range(0, len(members), most):
            chunk = members[c:c + most]
            if len(chunk) < 2:
                continue
            operands, ids, spans = [], [], []
            for i in chunk:
                spans.append((len(operands), len(operands) + len(steps[i][2])))
                operands.extend(steps[i][2])
                ids.extend(steps[i][4])
            place[chunk[0]] = (SET_KEY, BankSetStep([steps[i][1] for i in chunk], spans), operands, {}, ids)
            drop.update(chunk[1:])
            count += 1
    out = [place.get(i, st) for i, st in enumerate(steps) if i not in drop]
    return out, count


def reference_bank_linear(x, w, a_bank, b_bank, slots, ranks, scales):
    """What `stream.lora_bank_linear` computes, in f32 torch ops (tests and checks): y [..., N] =
    x·Wᵀ + scales[j]·(x·A_j[:r_j]ᵀ)·B_j[:, :r_j]ᵀ per row, j = slots[row] (−1: base only), rounded
    once to x's dtype; a_bank [S, R, K], b_bank [S, N, R]."""
    k, n = w.shape[1], w.shape[0]
    x2 = x.reshape(-1, k).float()
    y = x2 @ w.float().t()
    for i, j in enumerate(slots.tolist()):
        if j >= 0:
            r = int(ranks[j])
            y[i] += float(scales[j]) * ((x2[i] @ a_bank[j, :r].float().t()) @ b_bank[j, :, :r].float().t())
    return y.to(x.dtype).reshape(*x.shape[:-1], n)
