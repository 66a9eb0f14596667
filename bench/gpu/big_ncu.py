"""One launch each of lora_lowrank (pre, 4096 rows, r16) for ncu: the whole chip and 16 blocks."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
from stageml_torch import big  # noqa: E402

M = N = K = 4096
x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
a = (torch.randn(16, K, device="cuda") / 64).to(torch.bfloat16)
b = (torch.randn(N, 16, device="cuda") / 4).to(torch.bfloat16)
y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
kern = tuple(int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "8,1,4,1").split(","))
s = torch.cuda.current_stream().cuda_stream
for grid in (0, 16):
    big.lowrank(x, a, b, y, 2.0, 16, kern, 0, grid, s)
torch.cuda.synchronize()
ref = 2.0 * (x.float() @ a.float().t()) @ b.float().t()
print("rel err", float((y.float() - ref).norm() / ref.norm()))
