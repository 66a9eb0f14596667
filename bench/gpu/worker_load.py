"""The torch worker's side of start-up on the device (no Node needed): `load` of every weight of a
checkpoint's model.safetensors (memory-mapped, converted on the device), `alloc` of slot tables
shaped as the engine's (S slots, rank R, every projection of every layer, f32 or bf16 factors)
and one `write` per adapter slot (its rows), timed; then checks the loaded tensors against a plain
read and a written slot against its rows. Prints one JSON line.

    python3 bench/gpu/worker_load.py --model DIR/model [--slots 65] [--rank 16] [--factor-dtype f32|bf16] [--device cuda]
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
from stageml_torch.safetensors_io import MappedSafetensors  # noqa: E402
from stageml_torch.worker import Worker  # noqa: E402


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--slots", type=int, default=65)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--factor-dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    path = os.path.join(args.model, "model.safetensors")
    m = MappedSafetensors(path)
    names = [n for n in m.header if n != "__metadata__"]
    t0 = time.perf_counter()
    w = Worker(args.device)
    hello, _ = w.handle({"op": "hello"}, {})
    t1 = time.perf_counter()
    files = [{"id": i + 1, "file": path, "tensor": n, "dtype": "bf16", "shape": m.header[n]["shape"]} for i, n in enumerate(names)]
    reply, _ = w.handle({"op": "load", "files": files}, {})
    sync(args.device)
    t2 = time.perf_counter()
    h, hd, inter = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    dims = [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)] * cfg["num_hidden_layers"]
    base = len(files) + 1
    allocs = []
    for j, (i, o) in enumerate(dims):
        allocs += [{"id": base + 2 * j, "dtype": args.factor_dtype, "shape": [args.slots, args.rank, i]}, {"id": base + 2 * j + 1, "dtype": args.factor_dtype, "shape": [args.slots, args.rank, o]}]
    table_bytes = w.handle({"op": "alloc", "allocs": allocs}, {})[0]["bytes"]
    sync(args.device)
    t3 = time.perf_counter()
    gen = torch.Generator().manual_seed(1)
    rows_of = {}
    for slot in range(1, args.slots):
        writes, tensors = [], {}
        for j, (i, o) in enumerate(dims):
            for k, width in ((0, i), (1, o)):
                name = "w%d_%d" % (j, k)
                tensors[name] = rows = torch.rand(args.rank * width, generator=gen)
                writes.append({"id": base + 2 * j + k, "start": slot * args.rank * width, "tensor": name})
                if slot == args.slots - 1 and j == 0 and k == 0:
                    rows_of["check"] = rows
        w.handle({"op": "write", "writes": writes}, tensors)
    sync(args.device)
    t4 = time.perf_counter()
    ok = all(torch.equal(w.resident[f["id"]].cpu(), m.tensor(f["tensor"]).to(torch.bfloat16)) for f in files[:: max(1, len(files) // 8)])
    dt = torch.float32 if args.factor_dtype == "f32" else torch.bfloat16
    last = w.resident[base][args.slots - 1].reshape(-1).cpu()
    ok_write = torch.equal(last, rows_of["check"].to(dt))
    print(json.dumps({"device": hello["device"], "deviceName": hello["deviceName"], "memory": hello["memory"], "torch": torch.__version__, "tensors": len(files), "weightBytes": reply["bytes"], "tableBytes": table_bytes,
                      "workerStartS": t1 - t0, "loadS": t2 - t1, "loadGBps": reply["bytes"] / (t2 - t1) / 1e9, "allocS": t3 - t2, "writesS": t4 - t3, "slotsWritten": args.slots - 1, "loadedEqualRead": ok, "writtenEqualRows": ok_write}))


if __name__ == "__main__":
    main()
