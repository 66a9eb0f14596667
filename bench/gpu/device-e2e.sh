#!/usr/bin/env bash
# The GPU end-to-end run as one device command (from the carried folder holding native/, bench/gpu/,
# bundles/, triton/, fixtures/ and mixes.json, as bench/gpu/stage-device.sh lays it out).
# Usage: bash bench/gpu/device-e2e.sh OUTDIR [worker|e2e|decode|kernels|all]
set -u
OUTDIR=${1:?output directory}
WHAT=${2:-all}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/native${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.used --format=csv
python3 -c "import torch, triton, transformers, peft; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
START=$(date +%s)
if [ "$WHAT" = worker ] || [ "$WHAT" = all ]; then
  timeout 120 python3 bench/gpu/worker_smoke.py --root . --out "$OUTDIR/worker.json" > "$OUTDIR/worker.log" 2>&1
  echo "worker exit $? after $(( $(date +%s) - START )) s"; grep -E '"(run_ok|logits_max_abs_diff_vs_in_process|decode_step_roundtrip_ms_median|exit_code|device|deviceName)"' "$OUTDIR/worker.log"
fi
if [ "$WHAT" = kernels ] || [ "$WHAT" = all ]; then
  timeout "${KERNEL_BUDGET:-240}" python3 bench/gpu/splitk.py --out "$OUTDIR/gpu-kernels.json" --generated triton/lora-bf16-r16 > "$OUTDIR/kernels.log" 2>&1
  echo "kernels exit $? after $(( $(date +%s) - START )) s"; grep -v "^ " "$OUTDIR/kernels.log" | tail -12
fi
if [ "$WHAT" = e2e ] || [ "$WHAT" = all ]; then
  # The library code the comparison rests on (PEFT's LoRA forward, transformers' SDPA call, Llama's norm and rotary).
  python3 - > "$OUTDIR/sources.txt" 2>&1 <<'PY'
import inspect
import peft.tuners.lora.layer as lora
import transformers.integrations.sdpa_attention as sdpa
import transformers.models.llama.modeling_llama as llama
for f in (lora.Linear.forward, lora.LoraLayer._cast_input_dtype, sdpa.sdpa_attention_forward, sdpa.use_gqa_in_sdpa, llama.LlamaRMSNorm.forward, llama.apply_rotary_pos_emb, llama.LlamaRotaryEmbedding.forward):
    try:
        print("#", f.__qualname__); print(inspect.getsource(f))
    except Exception as e:  # noqa: BLE001
        print("#", f, "unavailable:", e)
PY
  timeout "${E2E_BUDGET:-200}" python3 bench/gpu/e2e.py --root . --out "$OUTDIR/e2e.json" > "$OUTDIR/e2e.log" 2>&1
  echo "e2e exit $? after $(( $(date +%s) - START )) s"; grep -v "^ " "$OUTDIR/e2e.log" | tail -12
fi
if [ "$WHAT" = decode ] || [ "$WHAT" = all ]; then
  timeout "${DECODE_BUDGET:-330}" python3 bench/gpu/decode8b.py --root . --out "$OUTDIR/decode8b.json" > "$OUTDIR/decode8b.log" 2>&1
  echo "decode exit $? after $(( $(date +%s) - START )) s"; grep -v "^ " "$OUTDIR/decode8b.log" | tail -30
fi
