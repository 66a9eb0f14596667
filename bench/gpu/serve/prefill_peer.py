"""transformers' own prefill on the generated checkpoint (run.sh's model directory): one forward of
ROWS prompts of LEN tokens (bf16, sdpa, no cache kept), the yardstick for the worker's prefill runs
(prefill_prof.py). Prints ms per forward (median of 5 after 2 warm-ups) per (rows, len).

    python3 bench/gpu/serve/prefill_peer.py MODEL_DIR [ROWSxLEN ...]   (default 1x128 32x128 64x128)
"""
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def main(argv):
    model = AutoModelForCausalLM.from_pretrained(argv[0], dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    vocab = model.config.vocab_size
    for spec in argv[1:] or ["1x128", "32x128", "64x128"]:
        rows, length = (int(v) for v in spec.split("x"))
        ids = torch.randint(3, vocab, (rows, length), device="cuda")
        times = []
        with torch.no_grad():
            for i in range(7):
                torch.cuda.synchronize()
                t = time.perf_counter()
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
                torch.cuda.synchronize()
                if i >= 2:
                    times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        print(f"transformers prefill {rows}x{length}: {times[len(times) // 2]:.2f} ms (min {times[0]:.2f})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
