"""Four launches of one lora_wgt / lora_wg configuration (one adapter, 4096², r16) on four operand
sets, for Nsight Compute to profile the last (ncu -k regex:lora_w --launch-skip 3 --launch-count 1).

    python3 bench/gpu/wgt_ncu.py "wgt,64,2,1,8,12,4,1" ROWS
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
from stageml_torch import stream as st  # noqa: E402

N = K = 4096
parts = sys.argv[1].split(",")
cfg = (parts[0],) + tuple(int(v) for v in parts[1:])
m = int(sys.argv[2])
sets = []
for _ in range(4):
    sets.append((torch.randn(m, K, device="cuda").to(torch.bfloat16), (torch.randn(N, K, device="cuda") / 64).to(torch.bfloat16),
                 (torch.randn(16, K, device="cuda") / 64).to(torch.bfloat16), (torch.randn(N, 16, device="cuda") / 4).to(torch.bfloat16)))
y = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
for x, w, a, b in sets:
    if st.lora_linear(x, w, a, b, 2.0, cfg=cfg, out=y) is None:
        sys.exit("declined")
torch.cuda.synchronize()
x, w, a, b = sets[-1]
ref = x.double() @ w.double().t() + 2.0 * (x.double() @ a.double().t()) @ b.double().t()
print(cfg, m, "rel err", float((y.double() - ref).norm() / ref.norm()))
