"""A residual graph (the IR's JSON form, `graphToJson`) prepared once on a device and run many
times with torch."""

import os

import torch

from . import errors
from .dims import bind_dims, evaluate_dim
from .bank import KEY as BANK_KEY
from .bank import OP_KEY as BANK_OP_KEY
from .bank import SET_KEY as BANK_SET_KEY
from .bank import bind_kernels, group_banks
from .bank import warm as warm_banks
from .ops import DTYPES, HALF, NATIVE_HALF_ON_CUDA, OPS

GRAPH_FORMAT = "stageml.graph"
GRAPH_VERSION = 1

# Steps that take their operands as stored (`loraBank`'s, `loraBankLinear`'s and `loraLinear`'s handlers widen what each of their ops must).
RAW_OPERANDS = {"loraBank", "loraLinear", BANK_OP_KEY, BANK_KEY, BANK_SET_KEY}


def op_key(printed):
    """`sml.rms_norm` → `rmsNorm` (the registry key)."""
    name = printed[4:] if printed.startswith("sml.") else printed
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


class _Ctx:
    __slots__ = ("device", "env", "generator", "memo", "consts", "host")

    def __init__(self, device, env, generator, consts, host=None):
        self.device = device
        self.env = env
        self.generator = generator
        # Per-run facts ops may share (op_attention: whether a mask tensor is all zeros; an index's
        # bounds).
        self.memo = {}
        # Device address -> (device tensor, the host tensor it was copied from) for the inputs
        # this run moved to the device (held here, so no other tensor takes their memory during
        # the run): what an op reads on the host of one of them or of a reshape of it (a mask's
        # zeros, an index's bounds) it reads from there, without waiting for the device
        # (ops.host_of).
        self.host = {} if host is None else host
        # The program's multi-valued constants by (attrs, shape), built on first use (op_constant).
        self.consts = consts

    def dim(self, d):
        return evaluate_dim(d, self.env)


def check_graph(doc, extra_ops=None):
    """Validates the JSON document's envelope and op names (the registry's, and `extra_ops`: a
    tensor-parallel rank's collectives, tp.py); raises `WorkerError`."""
    if not isinstance(doc, dict) or doc.get("format") != GRAPH_FORMAT:
        raise errors.WorkerError(errors.PROTOCOL, "graph must be a %s JSON document" % GRAPH_FORMAT)
    if doc.get("version") != GRAPH_VERSION:
        raise errors.WorkerError(errors.PROTOCOL, "graph JSON version %r is not supported (this worker reads %d)" % (doc.get("version"), GRAPH_VERSION))
    for i, n in enumerate(doc["nodes"]):
        if n["kind"] == "op" and op_key(n["op"]) not in OPS and op_key(n["op"]) not in (extra_ops or {}):
            raise errors.WorkerError(errors.UNSUPPORTED, "node %d (%s): op %s has no torch lowering" % (i, n["results"][0]["name"], n["op"]))


class Program:
    """`graph_json` prepared on `device` with parameter tensors `params` (name → tensor).

    Parameters are moved to the device once (resident); `run(inputs)` takes and returns tensors by
    name. Each op runs its entry of the op table `ops.OPS`, except where a kernel step takes it:
    `fused_slots` counts the `loraBankLinear` steps `bank.bind_kernels` gave the bank kernel,
    `slot_sets` the sets of them `bank.group_banks` formed, `cache_concats` the joins
    of a cache with the step's keys or values that may append in place (two per `cachedAttention`).
    Missing parameters are `RT_MISSING_WEIGHT`, wrong dtypes or shapes `RT_BAD_VALUE`. `extra_ops`
    (key → function) are ops beyond the table's: a tensor-parallel rank's collectives (tp.TP_OPS).
    """

    def __init__(self, graph_json, params, device="cpu", seed=0, extra_ops=None):
        check_graph(graph_json, extra_ops)
        extra_ops = extra_ops or {}
        self.doc = graph_json
        self.name = graph_json["name"]
        self.device = torch.device(device)
        self.on_cuda = self.device.type == "cuda"
        nodes = graph_json["nodes"]
        self.value_types = []
        self.steps = []
        self.inputs = []
        self.params = {}
        param_entries = []
        for n in nodes:
            ids = list(range(len(self.value_types), len(self.value_types) + len(n["results"])))
            for r in n["results"]:
                self.value_types.append((r["name"], r["type"]["dtype"], r["type"]["shape"]))
            if n["kind"] == "input":
                self.inputs.append((n["results"][0]["name"], ids[0]))
            elif n["kind"] == "param":
                name, dtype, shape = self.value_types[ids[0]]
                if name not in params:
                    raise errors.WorkerError(errors.MISSING_WEIGHT, "parameter '%s' (%s%s) has no data" % (name, dtype, shape))
                t = params[name]
                if t.dtype != DTYPES[dtype]:
                    raise errors.WorkerError(errors.BAD_VALUE, "parameter '%s' is %s, declared %s" % (name, t.dtype, dtype))
                param_entries.append((name, shape, tuple(t.shape)))
                self.params[ids[0]] = t.to(self.device).contiguous()
            else:
                key = op_key(n["op"])
                self.steps.append((key, OPS[key] if key in OPS else extra_ops[key], n["operands"], n.get("attrs", {}), ids))
        self.param_env = bind_dims(param_entries)
        self.outputs = [(o["name"], o["value"]) for o in graph_json["outputs"]]
        # `loraBankLinear` steps the bank kernel computes (its base linear and update together).
        self.steps, self.fused_slots = bind_kernels(self.steps, self.value_types, self.on_cuda)
        # Those of one input (q, k, v; gate, up) as one step each (bank.BankSetStep);
        # STAGEML_TORCH_BANK_SETS=0 keeps them apart.
        self.slot_sets = 0
        if self.fused_slots and os.environ.get("STAGEML_TORCH_BANK_SETS", "auto") != "0":
            self.steps, self.slot_sets = group_banks(self.steps, [v for _, v in self.outputs])
        # The bank kernels those steps can reach, built (and loaded) before the first run, so that
        # no serving step pays a build (bank.warm; on CUDA, once per process and shapes).
        self.warmed_banks = warm_banks(self.steps, self.value_types, self.device) if self.fused_slots else 0
        # `cachedAttention` appends the step's keys and values to a staged cache in place (worker.py).
        self.cache_concats = 2 * sum(1 for st in self.steps if st[0] == "cachedAttention")
        # Last use of each value, so intermediates are freed as soon as they are dead.
        last = {}
        for si, (_, _, operands, _, _) in enumerate(self.steps):
            for v in operands:
                last[v] = si
        keep = {v for _, v in self.outputs}
        self.free_after = [[v for v in operands if last.get(v) == si and v not in keep and v not in self.params] for si, (_, _, operands, _, _) in enumerate(self.steps)]
        self.consts = {}
        self._planned = None
        self._steps_plan = []
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def input_names(self):
        return [n for n, _ in self.inputs]

    def output_names(self):
        return [n for n, _ in self.outputs]

    def prime(self, inputs):
        """Lets each kernel step that has a `prime` derive, from the operands that are inputs or
        parameters (None for those a run computes), what it would otherwise derive at its first run:
        a CUDA graph's capture (cudagraph.py) calls this first, since the derivation reads the device
        from the host."""
        vals = dict(self.params)
        for name, vid in self.inputs:
            t = inputs.get(name)
            if t is not None and t.device.type == torch.device(self.device).type:
                vals[vid] = t
        for _, fn, operands, _, _ in self.steps:
            p = getattr(fn, "prime", None)
            if p is not None:
                p([vals.get(v) for v in operands])

    def _plan(self):
        """Per step what `run` needs beyond the step itself, derived once (again where `steps` was
        replaced): whether its operands stay in half precision, its results' dtypes, the values dead
        after it."""
        if self._planned is not self.steps:
            self._steps_plan = [
                (key, fn, operands, attrs, ids, key in RAW_OPERANDS or (self.on_cuda and key in NATIVE_HALF_ON_CUDA), [DTYPES[self.value_types[v][1]] for v in ids], self.free_after[si])
                for si, (key, fn, operands, attrs, ids) in enumerate(self.steps)
            ]
            self._planned = self.steps
        return self._steps_plan

    def run(self, inputs, keep=()):
        """Runs on `inputs` (name → tensor, any device); returns name → tensor on the device: the
        outputs, and the intermediate values named in `keep` (diagnostics, e.g. per-layer hidden
        states; an unknown name is `RT_BAD_VALUE`)."""
        keep_ids = {}
        if keep:
            by_name = {n: i for i, (n, _, _) in enumerate(self.value_types)}
            for k in keep:
                if k not in by_name:
                    raise errors.WorkerError(errors.BAD_VALUE, "'%s' is not a value of @%s" % (k, self.name))
                keep_ids[k] = by_name[k]
        kept = set(keep_ids.values())
        declared = {n for n, _ in self.inputs}
        for k in inputs:
            if k not in declared:
                raise errors.WorkerError(errors.UNKNOWN_INPUT, "'%s' is not an input of @%s (inputs: %s)" % (k, self.name, ", ".join(sorted(declared)) or "none"))
        env_vals = dict(self.params)
        entries = []
        host = {}
        for name, vid in self.inputs:
            if name not in inputs:
                _, dtype, shape = self.value_types[vid]
                raise errors.WorkerError(errors.MISSING_INPUT, "input '%s' (%s%s) was not supplied" % (name, dtype, shape))
            t = inputs[name]
            _, dtype, shape = self.value_types[vid]
            if t.dtype != DTYPES[dtype]:
                raise errors.WorkerError(errors.BAD_VALUE, "input '%s' is %s, declared %s" % (name, t.dtype, dtype))
            entries.append((name, shape, tuple(t.shape)))
            env_vals[vid] = d = t.to(self.device, non_blocking=True)
            if d is not t and t.device.type == "cpu" and d.numel() > 0:
                host[d.data_ptr()] = (d, t)
        env = bind_dims(entries, self.param_env)
        ctx = _Ctx(self.device, env, self.generator, self.consts, host)
        for key, fn, operands, attrs, ids, half_native, wants, free in self._plan():
            args = [env_vals[v] for v in operands]
            if not half_native:
                args = [a.float() if a.dtype in HALF else a for a in args]
            try:
                outs = fn(args, attrs, ctx)
            except errors.WorkerError:
                raise
            except (RuntimeError, ValueError, IndexError, TypeError) as e:
                raise errors.WorkerError(errors.EVAL, "node %s (%s): %s" % (self.value_types[ids[0]][0], key, e)) from e
            for vid, want, t in zip(ids, wants, outs):
                env_vals[vid] = t if t.dtype == want else t.to(want)
            for v in free:
                if v not in kept:
                    env_vals.pop(v, None)
        out = {name: env_vals[vid] for name, vid in self.outputs}
        for k, vid in keep_ids.items():
            if vid not in env_vals:
                raise errors.WorkerError(errors.BAD_VALUE, "'%s' is not computed by the prepared steps (fused away)" % k)
            out[k] = env_vals[vid]
        return out
