#!/usr/bin/env bash
# Lays out the folder the device call carries (DEST, e.g. the checkout's .gpu/): the worker package,
# the GPU scripts, the bundles and kernels bench/gpu/prepare-e2e.ts wrote to PREP, the fixture.
# Usage: bash bench/gpu/stage-device.sh PREP DEST
set -eu
PREP=${1:?prepare output}; DEST=${2:?destination}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$DEST"; mkdir -p "$DEST/bench/gpu" "$DEST/native" "$DEST/fixtures/peft-tiny/llama/adapters"
cp -r "$ROOT/native/stageml_torch" "$DEST/native/"
find "$DEST/native" -name __pycache__ -prune -exec rm -rf {} +
cp "$ROOT"/bench/gpu/{e2e.py,decode8b.py,splitk.py,worker_smoke.py,device-e2e.sh,tma_smoke.py,wg_smoke.py,device-kernels.sh} "$DEST/bench/gpu/"
cp -r "$PREP"/bundles "$PREP"/triton "$PREP"/mixes.json "$DEST/"
cp "$ROOT/fixtures/peft-tiny/golden.json" "$DEST/fixtures/peft-tiny/"
cp -r "$ROOT/fixtures/peft-tiny/llama/base" "$DEST/fixtures/peft-tiny/llama/"
cp -r "$ROOT/fixtures/peft-tiny/llama/adapters/all-r16" "$DEST/fixtures/peft-tiny/llama/adapters/"
du -sh "$DEST"
