"""Fused base + LoRA at 4096 rows by K-concatenation, with x in place.

y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ = [x | t]·[W | s·B]ᵀ with t = x·Aᵀ. The executor owns the activation
buffer: X' [M, K + R'] (R' = r padded to a multiple of 64), the producer of x (the previous op)
writes its left K columns, so the fused linear is t = x·Aᵀ written into X'[:, K:] plus one GEMM with
K + R'. Timed against cuBLAS's base GEMM x·Wᵀ alone, CUDA-graph replay over 4 operand sets."""
import json, sys, torch

torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
M, K, N, r, s = 4096, 4096, 4096, 16, 2.0
sets = 4
out = {"shape": [M, K, N, r], "rows": []}
g = torch.Generator(device=dev).manual_seed(0)
def rnd(*shape, scale=1.0):
    return (torch.randn(*shape, device=dev, generator=g) * scale).to(torch.bfloat16)
for pad in (16, 64, 128):
    Rp = pad
    ops = []
    for _ in range(sets):
        x = rnd(M, K)
        W = rnd(N, K, scale=K ** -0.5)
        A = rnd(r, K, scale=K ** -0.5)
        B = rnd(N, r, scale=r ** -0.5)
        Xp = torch.zeros(M, K + Rp, device=dev, dtype=torch.bfloat16)
        Xp[:, :K] = x
        Ap = torch.zeros(Rp, K, device=dev, dtype=torch.bfloat16); Ap[:r] = A
        Wp = torch.zeros(N, K + Rp, device=dev, dtype=torch.bfloat16); Wp[:, :K] = W; Wp[:, K:K + r] = (B.float() * s).to(torch.bfloat16)
        y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        t = torch.empty(M, r, device=dev, dtype=torch.bfloat16)
        ops.append((x, W, A, B, Xp, Ap, Wp, y, t))
    def base():
        for (x, W, A, B, Xp, Ap, Wp, y, t) in ops:
            torch.matmul(x, W.t(), out=y)
    def fused():
        for (x, W, A, B, Xp, Ap, Wp, y, t) in ops:
            torch.matmul(Xp[:, :K], A.t(), out=t)
            Xp[:, K:K + r].copy_(t)
            torch.matmul(Xp, Wp.t(), out=y)
    def timed(fn, reps=20):
        fn(); torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            fn()
        ts = []
        for _ in range(reps):
            a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
            a.record(); gr.replay(); b.record(); torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) * 1000 / sets)
        ts.sort()
        return ts[len(ts) // 2]
    tb = timed(base)
    tf = timed(fused)
    # correctness against float64 on the first set
    x, W, A, B, Xp, Ap, Wp, y, t = ops[0]
    fused()
    ref = x.double() @ W.double().t() + s * (x.double() @ A.double().t()) @ B.double().t()
    rel = float((y.double() - ref).norm() / ref.norm())
    row = {"pad": Rp, "K_total": K + Rp, "base_us": tb, "fused_us": tf, "x_base": tf / tb, "rel_err": rel}
    print(json.dumps(row), flush=True)
    out["rows"].append(row)
out["device"] = torch.cuda.get_device_name()
out["torch"] = torch.__version__
json.dump(out, open(sys.argv[1], "w"), indent=1)
