"""Tensor parallelism: one residual graph rewritten into the graph one rank of N runs.

`shard_graph(doc, rank, world)` propagates a *layout* through the graph's JSON form, node by node,
and returns the rank's graph (local shapes in the input types and reshape attributes, collectives
inserted as `sml.tp_*` nodes that only this worker knows) with the layout of every input and
output. Layouts (Megatron-LM's, as vLLM uses them):

- `R`: every rank holds the whole value;
- `S(axis)`: rank r holds chunk r of `axis` split in `world` equal contiguous chunks;
- `P`: every rank holds a partial sum; the value is the sum over ranks (an all-reduce makes it R);
- `F`: not decided yet: an input, or a chain of shape ops and a row gather (`gather` on axis 0,
  the engine's slot tables) over one; the first op that needs it decides the input's layout, and
  the chain's reshape attributes are made local then.

The rules, by op, are what makes the usual transformer block need one all-reduce after the
attention's output projection and one after the MLP's down projection:

- `linear(x, W)` / `matmul(x, W)` whose W is an undecided weight: x replicated gives a
  column-parallel product (W split on its output features, the result S(last)), unless the
  result feeds another weight product (a LoRA shrink `x·Aᵀ`: A replicated, the result R, so that
  the expand `t·Bᵀ` is column-parallel with B split with the base weight's columns); x split on
  its features gives a row-parallel product (W split on its input features, the result P: the
  shrink of a row-parallel LoRA is P too, its expand takes B replicated, and the base's and the
  adapter's partial sums add before the one all-reduce);
- `gather(table, ids)` of an undecided 2-D table that an activation reads: vocabulary-parallel
  (each rank its rows, ids of other ranks' rows give zeros, then P);
- elementwise ops, reshape, transpose, slice, concat, rotary, rmsNorm along the unsplit axes keep
  S; `add`/`sub` of partial sums and `mul`/`div` of one by a replicated value keep P;
- `attention(q, k, v)`: heads split (query heads and key/value heads); with fewer key/value heads
  than ranks (GQA) the key/value projections stay replicated and each rank slices the head its
  query heads read (no collective);
- anything else (and anything a rule cannot place) takes its operands replicated: an
  all-gather of S, an all-reduce of P. So a graph this file knows nothing about still runs, only
  less sharded.

Outputs keep S (the worker all-gathers those it sends to the host; the caches it appends from
them stay sharded) or are made R. Unsupported head counts are `RT_TENSOR_PARALLEL` naming them.
"""

import copy
import os

import torch

from . import errors

TP_ERROR = "RT_TENSOR_PARALLEL"

R = ("R",)
P = ("P",)


def S(axis):
    return ("S", axis)


class _Free:
    """An undecided value: input `name` seen through `chain` (the emitted nodes from the input to
    this value), axis i of the value being axis `amap[i]` of the input (None: no input axis)."""

    __slots__ = ("name", "amap", "chain", "gather")

    def __init__(self, name, amap, chain, gather=None):
        self.name, self.amap, self.chain, self.gather = name, tuple(amap), list(chain), gather


UNARY = {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "silu", "gelu", "sin", "cos", "cast"}
LINEAR_UNARY = {"neg", "cast"}
BINARY = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "equal", "notEqual", "less", "lessEqual", "greater", "greaterEqual"}
# Ops the shrink look-ahead walks through from a product to the next one.
PASS_THROUGH = {"reshape", "mul", "cast", "transpose", "div"}


def _num(d):
    return isinstance(d, int) and not isinstance(d, bool)


def _norm(axis, rank):
    return axis + rank if axis < 0 else axis


class Sharder:
    def __init__(self, doc, rank, world):
        self.doc = doc
        self.rank = rank
        self.world = world
        self.src = doc["nodes"]
        self.nodes = []
        self.types = []  # new vid -> result dict (mutable: shapes made local)
        self.layout = []  # new vid -> layout or _Free
        self.remap = {}  # old vid -> new vid
        self.old_types = []
        self.producer = {}  # old vid -> (node index, result index)
        self.consumers = {}
        self.input_layout = {}
        self.conv = {}
        self.replicated = set()  # old vids a GQA attention needs whole on every rank
        self.collectives = 0
        vid = 0
        for ni, n in enumerate(self.src):
            for ri, r in enumerate(n["results"]):
                self.old_types.append(r["type"])
                self.producer[vid] = (ni, ri)
                vid += 1
            for pos, v in enumerate(n.get("operands", [])):
                self.consumers.setdefault(v, []).append((ni, pos))

    # -- helpers over the source graph ---------------------------------------------------------

    def _src_key(self, ni):
        n = self.src[ni]
        if n["kind"] != "op":
            return n["kind"]
        name = n["op"][4:] if n["op"].startswith("sml.") else n["op"]
        head, *rest = name.split("_")
        return head + "".join(p[:1].upper() + p[1:] for p in rest)

    def _weight_like(self, old, depth=0):
        """Whether old value `old` is a weight or a slot table seen through a row gather and shape ops."""
        if depth > 6:
            return False
        ni, _ = self.producer[old]
        n = self.src[ni]
        if n["kind"] == "input" or n["kind"] == "param":
            t = n["results"][0]["type"]
            return t["dtype"] in ("f32", "f16", "bf16", "f64") and all(_num(d) for d in t["shape"]) and len(t["shape"]) >= 2
        key = self._src_key(ni)
        if key == "gather" and (n.get("attrs") or {}).get("axis", 0) == 0:
            return self._weight_like(n["operands"][0], depth + 1)
        if key in ("reshape", "transpose", "cast"):
            return self._weight_like(n["operands"][0], depth + 1)
        return False

    def _is_shrink(self, old, depth=0):
        """Whether value `old` (a product's result) reaches, through shape ops and scalings, the
        activation operand of another product with a weight: a LoRA shrink's `x·Aᵀ`."""
        if depth > 6:
            return False
        for ni, pos in self.consumers.get(old, []):
            key = self._src_key(ni)
            n = self.src[ni]
            if key in ("matmul", "linear") and pos == 0 and self._weight_like(n["operands"][1]):
                return True
            if key in PASS_THROUGH:
                for r in range(len(n["results"])):
                    if self._is_shrink(self._old_result(ni, r), depth + 1):
                        return True
        return False

    def _old_result(self, ni, r):
        vid = 0
        for i in range(ni):
            vid += len(self.src[i]["results"])
        return vid + r

    def _low_rank(self, old_w, wshape, out_axis, in_axis):
        """A shrink's weight: an adapter factor, read through a slot gather (the engine's tables),
        or a narrow one (output features at most a quarter of the input's: a rank). Tells `x·Aᵀ`
        from a base product whose result also meets a product later (an MLP's up projection)."""
        o, i = wshape[out_axis], wshape[in_axis]
        if _num(o) and _num(i) and 4 * o <= i:
            return True
        v = old_w
        for _ in range(6):
            ni, _ = self.producer[v]
            n = self.src[ni]
            if n["kind"] != "op":
                return False
            key = self._src_key(ni)
            if key == "gather":
                return True
            if key not in ("reshape", "transpose", "cast"):
                return False
            v = n["operands"][0]
        return False

    def _mark_replicated(self, old, depth=0):
        """GQA with fewer key/value heads than ranks: the values from the key/value projections to
        the attention stay whole on every rank (marked back through shape ops, adds and products)."""
        if depth > 64 or old in self.replicated:
            return
        self.replicated.add(old)
        ni, _ = self.producer[old]
        n = self.src[ni]
        if n["kind"] != "op":
            return
        key = self._src_key(ni)
        if key in ("transpose", "reshape", "cast", "rotary"):
            self._mark_replicated(n["operands"][0], depth + 1)
        elif key in ("concat", "add", "sub"):
            for v in n["operands"]:
                self._mark_replicated(v, depth + 1)
        elif key in ("matmul", "linear", "mul"):
            self._mark_replicated(n["operands"][0], depth + 1)

    def _attention_heads(self):
        """Checks every attention's head counts against the world; marks GQA key/value chains."""
        for ni, n in enumerate(self.src):
            if n["kind"] != "op" or self._src_key(ni) != "attention":
                continue
            q, k = (self.old_types[v]["shape"] for v in n["operands"][:2])
            hq, hkv = q[-3], k[-3]
            if not (_num(hq) and _num(hkv)):
                continue
            if hq % self.world != 0:
                raise errors.WorkerError(TP_ERROR, "tensor-parallel size %d does not divide the %d attention heads of node %s" % (self.world, hq, n["results"][0]["name"]))
            if hkv % self.world != 0:
                if self.world % hkv != 0:
                    raise errors.WorkerError(TP_ERROR, "tensor-parallel size %d and the %d key/value heads of node %s: neither divides the other" % (self.world, hkv, n["results"][0]["name"]))
                for v in n["operands"][1:3]:
                    self._mark_replicated(v)

    # -- emitting --------------------------------------------------------------------------------

    def _emit(self, op, operands, attrs, rtype, name, layout):
        node = {"kind": "op", "op": op, "operands": list(operands), "attrs": attrs, "results": [{"name": name, "type": rtype}]}
        self.nodes.append(node)
        self.types.append(node["results"][0])
        self.layout.append(layout)
        return len(self.types) - 1

    def _shape(self, v):
        return self.types[v]["type"]["shape"]

    def _local(self, shape, axis):
        out = list(shape)
        if _num(out[axis]):
            out[axis] = out[axis] // self.world
        return out

    def _splittable(self, shape, axis):
        return 0 <= axis < len(shape) and _num(shape[axis]) and shape[axis] % self.world == 0

    # -- deciding undecided values ---------------------------------------------------------------

    def _decide_input(self, name, layout):
        """Sets input `name`'s layout (and makes its declared type local)."""
        self.input_layout[name] = None if layout == R else layout[1]

    def resolve(self, v, want):
        """Makes value v (new vid) have layout `want` (R or S(axis)); returns the vid that does."""
        lay = self.layout[v]
        if isinstance(lay, _Free):
            if lay.name in self.input_layout:
                # Decided already through another use: the chain is that layout now.
                self._settle(lay, self.input_layout[lay.name])
                return self.resolve(v, want)
            if want == R and lay.gather is not None and self._vocab_parallel(lay):
                return self.resolve(v, want)
            if want == R:
                self._settle(lay, None)
                return v
            axis = lay.amap[want[1]] if want[1] < len(lay.amap) else None
            inp_shape = self.types[self.remap_input(lay.name)]["type"]["shape"]
            if axis is None or not self._splittable(inp_shape, axis):
                self._settle(lay, None)
                return self.resolve(v, want)
            self._settle(lay, axis)
            return v
        if lay == want:
            return v
        key = (v, want)
        if key in self.conv:
            return self.conv[key]
        t = self.types[v]
        name = t["name"] + (".tp_full" if want == R else ".tp_shard%d" % want[1])
        if lay == P:
            out = self._emit("sml.tp_all_reduce", [v], {}, copy.deepcopy(t["type"]), name, R)
            self.collectives += 1
            if want != R:
                out = self.resolve(out, want)
        elif lay == R:
            shape = self._shape(v)
            if not self._splittable(shape, want[1]):
                return None
            size = shape[want[1]] // self.world
            out = self._emit("sml.tp_slice", [v], {"axis": want[1], "start": self.rank * size, "length": size}, {"dtype": t["type"]["dtype"], "shape": self._local(shape, want[1])}, name, want)
        else:
            full = list(self._shape(v))
            if _num(full[lay[1]]):
                full[lay[1]] = full[lay[1]] * self.world
            out = self._emit("sml.tp_all_gather", [v], {"axis": lay[1]}, {"dtype": t["type"]["dtype"], "shape": full}, name, R)
            self.collectives += 1
            if want != R:
                out = self.resolve(out, want)
        self.conv[key] = out
        return out

    def remap_input(self, name):
        return self.input_vid[name]

    def _settle(self, free, axis):
        """Input `free.name` decided: axis `axis` split (None: replicated); the chain's layouts,
        result shapes and reshape attributes follow."""
        self.input_layout[free.name] = axis
        iv = self.input_vid[free.name]
        if axis is not None and self.layout[iv] != S(axis):
            self.types[iv]["type"]["shape"] = self._local(self.types[iv]["type"]["shape"], axis)
        self.layout[iv] = R if axis is None else S(axis)
        for node, amap in free.chain:
            vid = self._vid_of(node)
            if self.layout[vid] != R and not isinstance(self.layout[vid], _Free):
                continue
            if axis is None or axis not in amap:
                self.layout[vid] = R
                continue
            j = amap.index(axis)
            self.layout[vid] = S(j)
            res = node["results"][0]["type"]
            res["shape"] = self._local(res["shape"], j)
            if node["op"] == "sml.reshape":
                shape = list(node["attrs"]["shape"])
                if _num(shape[j]) and shape[j] > 0:
                    shape[j] //= self.world
                    node["attrs"] = dict(node["attrs"], shape=shape)

    def _vid_of(self, node):
        return self.node_vid[id(node)]

    def _vocab_parallel(self, free):
        """An embedding lookup wanted whole: the table split on its rows, the lookup masked, P."""
        node = free.gather
        iv = self.input_vid[free.name]
        shape = self.types[iv]["type"]["shape"]
        if len(free.chain) != 1 or len(shape) != 2 or not self._splittable(shape, 0):
            return False
        self.input_layout[free.name] = 0
        self.types[iv]["type"]["shape"] = self._local(shape, 0)
        self.layout[iv] = S(0)
        rows = self.types[iv]["type"]["shape"][0]
        node["op"] = "sml.tp_vocab_gather"
        node["attrs"] = {"start": self.rank * rows, "length": rows}
        self.layout[self._vid_of(node)] = P
        return True

    # -- the walk --------------------------------------------------------------------------------

    def run(self):
        self._attention_heads()
        self.input_vid = {}
        self.node_vid = {}
        old = 0
        for ni, n in enumerate(self.src):
            key = self._src_key(ni)
            if n["kind"] != "op":
                node = copy.deepcopy(n)
                self.nodes.append(node)
                for r in node["results"]:
                    self.types.append(r)
                    nv = len(self.types) - 1
                    self.remap[old] = nv
                    self.node_vid[id(node)] = nv
                    name = r["name"]
                    self.input_vid[name] = nv
                    self.layout.append(_Free(name, range(len(r["type"]["shape"])), []))
                    old += 1
                continue
            operands = [self.remap[v] for v in n["operands"]]
            outs = [old + i for i in range(len(n["results"]))]
            self._op(key, n, operands, outs)
            old += len(n["results"])
        outputs = []
        out_layout = {}
        for o in self.doc["outputs"]:
            v = self.remap[o["value"]]
            lay = self.layout[v]
            if isinstance(lay, _Free) or lay == P:
                v = self.resolve(v, R)
                lay = R
            out_layout[o["name"]] = None if lay == R else lay[1]
            outputs.append(dict(o, value=v))
        for name, v in self.input_vid.items():
            if isinstance(self.layout[v], _Free):
                self.layout[v] = R
            self.input_layout.setdefault(name, None)
        doc = dict(self.doc, nodes=self.nodes, outputs=outputs)
        return doc, self.input_layout, out_layout

    def _copy(self, n, operands, layout, shape_axis=None):
        node = copy.deepcopy(n)
        node["operands"] = list(operands)
        if shape_axis is not None:
            t = node["results"][0]["type"]
            t["shape"] = self._local(t["shape"], shape_axis)
        self.nodes.append(node)
        first = len(self.types)
        for r in node["results"]:
            self.types.append(r)
            self.layout.append(layout)
        self.node_vid[id(node)] = first
        return node, first

    def _finish(self, outs, first, count):
        for i in range(count):
            self.remap[outs[i]] = first + i

    def _generic(self, n, operands, outs):
        args = [self.resolve(v, R) for v in operands]
        node, first = self._copy(n, args, R)
        self._finish(outs, first, len(n["results"]))

    def _op(self, key, n, operands, outs):
        lays = [self.layout[v] for v in operands]
        attrs = n.get("attrs") or {}
        rshape = n["results"][0]["type"]["shape"]
        if key in UNARY and len(operands) == 1:
            lay = lays[0]
            if isinstance(lay, _Free):
                node, first = self._copy(n, operands, None)
                self.layout[first] = _Free(lay.name, lay.amap, lay.chain + [(node, lay.amap)], None)
                return self._finish(outs, first, 1)
            if lay == P and key not in LINEAR_UNARY:
                return self._generic(n, operands, outs)
            node, first = self._copy(n, operands, lay, lay[1] if lay[0] == "S" else None)
            return self._finish(outs, first, 1)
        if key in ("reshape", "transpose"):
            return self._shape_op(key, n, operands, outs, lays[0], attrs)
        if key in BINARY:
            return self._binary(key, n, operands, outs, lays, rshape)
        if key in ("linear", "matmul"):
            return self._product(key, n, operands, outs, lays, attrs)
        if key == "gather":
            return self._gather(n, operands, outs, lays, attrs)
        if key == "concat":
            ax = _norm(attrs.get("axis", 0), len(rshape))
            split = [l for l in lays if isinstance(l, tuple) and l[0] == "S" and l[1] != ax]
            if split:
                want = split[0]
                args = [self.resolve(v, want) for v in operands]
                if None not in args and all(self.layout[a] == want for a in args):
                    node, first = self._copy(n, args, want, want[1])
                    return self._finish(outs, first, 1)
            return self._generic(n, operands, outs)
        if key == "slice":
            lay = lays[0]
            ax = _norm(attrs["axis"], len(rshape))
            if isinstance(lay, tuple) and (lay == P or (lay[0] == "S" and lay[1] != ax)):
                node, first = self._copy(n, operands, lay, lay[1] if lay[0] == "S" else None)
                return self._finish(outs, first, 1)
            return self._generic(n, operands, outs)
        if key in ("rmsNorm", "layerNorm"):
            lay = lays[0]
            if isinstance(lay, tuple) and lay[0] == "S" and lay[1] != len(rshape) - 1:
                args = [operands[0]] + [self.resolve(v, R) for v in operands[1:]]
                node, first = self._copy(n, args, lay, lay[1])
                return self._finish(outs, first, 1)
            return self._generic(n, operands, outs)
        if key == "rotary":
            lay = lays[0]
            if isinstance(lay, tuple) and lay[0] == "S" and lay[1] < len(rshape) - 1:
                ok = True
                args = [operands[0]]
                for v in operands[1:]:
                    a = self.resolve(v, R)
                    sh = self._shape(a)
                    off = len(rshape) - len(sh)
                    if lay[1] - off >= 0 and sh[lay[1] - off] != 1:
                        ok = False
                    args.append(a)
                if ok:
                    node, first = self._copy(n, args, lay, lay[1])
                    return self._finish(outs, first, 1)
            return self._generic(n, operands, outs)
        if key == "attention":
            return self._attention(n, operands, outs, lays, rshape)
        return self._generic(n, operands, outs)

    def _shape_op(self, key, n, operands, outs, lay, attrs):
        src_shape = self._shape(operands[0])
        rshape = n["results"][0]["type"]["shape"]
        if key == "transpose":
            perm = attrs["perm"]
            if isinstance(lay, _Free):
                node, first = self._copy(n, operands, None)
                amap = [lay.amap[p] for p in perm]
                self.layout[first] = _Free(lay.name, amap, lay.chain + [(node, amap)], None)
                return self._finish(outs, first, 1)
            if lay[0] == "S":
                j = perm.index(lay[1])
                node, first = self._copy(n, operands, S(j), j)
                return self._finish(outs, first, 1)
            node, first = self._copy(n, operands, lay)
            return self._finish(outs, first, 1)
        # reshape
        if isinstance(lay, _Free):
            # An undecided value's type is still the whole one (made local when it is decided).
            amap = _trailing_map(self._shape(operands[0]), rshape, lay.amap)
            node, first = self._copy(n, operands, None)
            self.layout[first] = _Free(lay.name, amap, lay.chain + [(node, amap)], None)
            return self._finish(outs, first, 1)
        if lay in (R, P):
            node, first = self._copy(n, operands, lay)
            return self._finish(outs, first, 1)
        full_in = list(src_shape)
        if _num(full_in[lay[1]]):
            full_in[lay[1]] *= self.world
        j = _split_target(full_in, rshape, lay[1], self.world)
        if j is None:
            return self._generic(n, operands, outs)
        node, first = self._copy(n, operands, S(j), j)
        shape = list(attrs["shape"])
        if _num(shape[j]) and shape[j] > 0:
            shape[j] //= self.world
            node["attrs"] = dict(attrs, shape=shape)
        return self._finish(outs, first, 1)

    def _binary(self, key, n, operands, outs, lays, rshape):
        rank = len(rshape)
        split = None
        for v, l in zip(operands, lays):
            if isinstance(l, tuple) and l[0] == "S":
                off = rank - len(self._shape(v))
                split = l[1] + off
                break
        if split is None and P in lays:
            ok = (key in ("add", "sub") and all(l == P for l in lays)) or (key in ("mul", "div") and lays[0] == P and lays[1] != P) or (key == "mul" and lays[1] == P and lays[0] != P)
            if ok:
                args = [v if self.layout[v] == P else self.resolve(v, R) for v in operands]
                node, first = self._copy(n, args, P)
                return self._finish(outs, first, 1)
            return self._generic(n, operands, outs)
        if split is None:
            return self._generic(n, operands, outs)
        args = []
        for v, l in zip(operands, lays):
            off = rank - len(self._shape(v))
            local = split - off
            sh = self._shape(v)
            if local < 0 or sh[local] == 1:
                args.append(self.resolve(v, R))
                continue
            a = self.resolve(v, S(local))
            if a is None or self.layout[a] != S(local):
                return self._generic(n, operands, outs)
            args.append(a)
        node, first = self._copy(n, args, S(split), split)
        return self._finish(outs, first, 1)

    def _product(self, key, n, operands, outs, lays, attrs):
        x, w = operands[0], operands[1]
        lx, lw = lays[0], lays[1]
        old_out = outs[0]
        trans_b = key == "linear" or attrs.get("transposeB", False)
        if key == "matmul" and attrs.get("transposeA", False):
            return self._generic(n, operands, outs)
        wshape = self._shape(w)
        rshape = n["results"][0]["type"]["shape"]
        out_axis = len(wshape) - 2 if trans_b else len(wshape) - 1
        in_axis = len(wshape) - 1 if trans_b else len(wshape) - 2
        xshape = self._shape(x)
        if len(operands) > 2 or old_out in self.replicated or isinstance(lx, _Free):
            return self._generic(n, operands, outs)
        if lx == P:
            wr = self.resolve(w, R)
            node, first = self._copy(n, [x, wr], P)
            return self._finish(outs, first, 1)
        if lx == R:
            if not (isinstance(lw, _Free) or lw == S(out_axis)) or self._is_shrink(old_out) and self._low_rank(n["operands"][1], wshape, out_axis, in_axis):
                return self._generic(n, operands, outs)
            ws = self.resolve(w, S(out_axis))
            if self.layout[ws] != S(out_axis):
                return self._generic(n, operands, outs)
            node, first = self._copy(n, [x, ws], S(len(rshape) - 1), len(rshape) - 1)
            return self._finish(outs, first, 1)
        if lx[0] == "S" and lx[1] == len(xshape) - 1:
            ws = self.resolve(w, S(in_axis))
            if ws is None or self.layout[ws] != S(in_axis):
                return self._generic(n, operands, outs)
            node, first = self._copy(n, [x, ws], P)
            return self._finish(outs, first, 1)
        return self._generic(n, operands, outs)

    def _gather(self, n, operands, outs, lays, attrs):
        table, idx = operands
        lt = lays[0]
        ax = attrs.get("axis", 0)
        idx_r = self.resolve(idx, R)
        if isinstance(lt, _Free) and ax == 0 and len(lt.chain) == 0:
            node, first = self._copy(n, [table, idx_r], None)
            nidx = len(self._shape(idx_r))
            amap = [None] * nidx + list(lt.amap[1:])
            self.layout[first] = _Free(lt.name, amap, [(node, amap)], node)
            return self._finish(outs, first, 1)
        if isinstance(lt, tuple) and lt[0] == "S" and lt[1] != _norm(ax, len(self._shape(table))):
            tax = lt[1]
            nidx = len(self._shape(idx_r))
            j = tax if tax < ax else tax - 1 + nidx
            node, first = self._copy(n, [table, idx_r], S(j), j)
            return self._finish(outs, first, 1)
        return self._generic(n, operands, outs)

    def _attention(self, n, operands, outs, lays, rshape):
        q = operands[0]
        lq = lays[0]
        if lq != S(1):
            return self._generic(n, operands, outs)
        args = [q]
        hq = self._shape(q)[1] * self.world if _num(self._shape(q)[1]) else None
        for v in operands[1:3]:
            if self.old_of(v) in self.replicated:
                a = self.resolve(v, R)
                hkv = self._shape(a)[1]
                group = hq // hkv
                per = hq // self.world
                first_head = (self.rank * per) // group
                count = ((self.rank + 1) * per - 1) // group + 1 - first_head
                t = self.types[a]
                a = self._emit("sml.tp_slice", [a], {"axis": 1, "start": first_head, "length": count}, {"dtype": t["type"]["dtype"], "shape": [d if i != 1 else count for i, d in enumerate(self._shape(a))]}, t["name"] + ".tp_heads", S(1))
                args.append(a)
            else:
                a = self.resolve(v, S(1))
                if a is None or self.layout[a] != S(1):
                    return self._generic(n, operands, outs)
                args.append(a)
        args += [self.resolve(v, R) for v in operands[3:]]
        node, first = self._copy(n, args, S(1), 1)
        return self._finish(outs, first, 1)

    def old_of(self, new):
        for o, nv in self.remap.items():
            if nv == new:
                return o
        return None


def _trailing_map(src, dst, amap):
    """Axis map of a reshape's result: trailing dims the reshape leaves alone keep their input
    axis; the others have none."""
    out = [None] * len(dst)
    i, j = len(src) - 1, len(dst) - 1
    while i >= 0 and j >= 0 and src[i] == dst[j] and _num(src[i]):
        out[j] = amap[i]
        i -= 1
        j -= 1
    # Leading dims that are one and the same symbol or number map too.
    k = 0
    while k < min(len(src), len(dst)) and k <= i and k <= j and src[k] == dst[k]:
        out[k] = amap[k]
        k += 1
    return out


def _split_target(src, dst, axis, world):
    """For a reshape of a value split on `axis` (full source shape `src`) into `dst`: the result
    axis whose equal chunks are the source's chunks, or None. Common leading and trailing dims
    are skipped; a split axis that is the outermost of the dims merged (or split) into a result
    axis maps to it when its size divides by `world`."""
    lead = 0
    while lead < min(len(src), len(dst)) and src[lead] == dst[lead]:
        lead += 1
    if axis < lead:
        return axis
    trail = 0
    while trail < min(len(src), len(dst)) - lead and src[len(src) - 1 - trail] == dst[len(dst) - 1 - trail]:
        trail += 1
    if axis >= len(src) - trail:
        return axis - len(src) + len(dst)
    mid_src = src[lead : len(src) - trail]
    mid_dst = dst[lead : len(dst) - trail]
    if not all(_num(d) and d > 0 for d in mid_src + mid_dst) or axis != lead:
        return None
    # The split axis is the outermost of the middle dims on the source side; its chunks stay
    # contiguous when the outermost result dim takes them whole (merge) or divides by world (split).
    if len(mid_src) == 1 and mid_dst[0] % world == 0:
        return lead
    if len(mid_dst) == 1 and mid_src[0] % world == 0:
        return lead
    return None


def shard_graph(doc, rank, world):
    """The graph rank `rank` of `world` runs, and the layouts of its inputs and outputs
    (name → split axis, None when whole)."""
    if world == 1:
        return doc, {}, {}
    sh = Sharder(doc, rank, world)
    new, ins, outs = sh.run()
    new["tpCollectives"] = sh.collectives
    return new, ins, outs


def chunk(t, axis, rank, world):
    """Rank `rank`'s equal chunk of `t` along `axis`."""
    size = t.shape[axis] // world
    return t.narrow(axis, rank * size, size)


# -- the collectives, as ops of the rank's graph ----------------------------------------------


class Group:
    """The process group of a tensor-parallel worker (set by dist.py): rank, world, and the group
    the compute collectives use."""

    rank = 0
    world = 1
    group = None


def op_all_reduce(x, a, ctx):
    # A copy: the partial sum may have other readers (an embedding's rows feed both the first
    # norm, whole, and the residual add, still partial).
    t = x[0].clone(memory_format=torch.contiguous_format)
    import torch.distributed as dist

    dist.all_reduce(t, group=Group.group)
    return [t]


def op_all_gather(x, a, ctx):
    import torch.distributed as dist

    t = x[0].contiguous()
    parts = [torch.empty_like(t) for _ in range(Group.world)]
    dist.all_gather(parts, t, group=Group.group)
    return [torch.cat(parts, dim=a["axis"])]


def op_slice_local(x, a, ctx):
    return [x[0].narrow(a["axis"], a["start"], a["length"])]


def op_vocab_gather(x, a, ctx):
    table, idx = x
    i = idx.long() - a["start"]
    inside = (i >= 0) & (i < a["length"])
    rows = torch.index_select(table, 0, torch.where(inside, i, torch.zeros_like(i)).reshape(-1))
    rows = rows.reshape(list(idx.shape) + list(table.shape[1:]))
    return [rows * inside.unsqueeze(-1).to(rows.dtype)]


TP_OPS = {"tpAllReduce": op_all_reduce, "tpAllGather": op_all_gather, "tpSlice": op_slice_local, "tpVocabGather": op_vocab_gather}


def timeout_seconds():
    """How long a collective waits for the other ranks (`STAGEML_TORCH_TP_TIMEOUT`, default 600 s)."""
    try:
        return float(os.environ.get("STAGEML_TORCH_TP_TIMEOUT", "600"))
    except ValueError:
        return 600.0
