"""stageml_torch: runs StageML residual graphs (the IR's JSON form) with PyTorch on CUDA or CPU.

- `graph.Program(graph_json, params, device)`: a graph prepared once (parameters resident on the
  device), `run(inputs)` many times; every IR op maps to torch (`ops.OPS`); LoRA linears run as
  one step (`fuse.py`; a split-K Triton kernel on CUDA, `triton_lora.py`).
- `bundle.load_bundle(dir, device)`: a residual bundle (manifest.json, residual.json,
  constants.safetensors, optional external weights) as a `Program`.
- `worker`: the framed stdio protocol the TypeScript `torch` executor speaks
  (`python3 -m stageml_torch.worker`).

Works on torch 1.13 (Debian's python3-torch, CPU) and torch 2.x (CUDA).
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 4
