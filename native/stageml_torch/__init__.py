"""stageml_torch: runs StageML residual graphs (the IR's JSON form) with PyTorch on CUDA or CPU.

- `graph.Program(graph_json, params, device)`: a graph prepared once (parameters resident on the
  device), `run(inputs)` many times; every IR op the worker runs has a handler in one table
  (`ops.OPS`), the serving ops `loraBank` (the bank kernel on CUDA: `bank.py`, `stream.py`) and
  `cachedAttention` (KV appended in place, SDPA) included; other composites arrive decomposed.
- `bundle.load_bundle(dir, device)`: a residual bundle (manifest.json, residual.json,
  constants.safetensors, optional external weights) as a `Program`.
- `worker`: the framed stdio protocol the TypeScript `torch` executor speaks
  (`python3 -m stageml_torch.worker`).

Works on torch 1.13 (Debian's python3-torch, CPU) and torch 2.x (CUDA).
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 6
