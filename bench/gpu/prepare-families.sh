#!/usr/bin/env bash
# Writes the bf16 residual bundles bench/gpu/families_cuda.py runs on the GPU machine (which has no
# Node): for every family of fixtures/hf-families and every model (base, each PEFT adapter),
# `stageml stage --cutoff adapter --dtype bf16` (LoRA term in f32, as PEFT computes it on a bf16
# base) into bench/gpu/out/families/<family>/<model>. Run from the repository root where Node runs;
# carry bench/gpu/out/families to the GPU machine with the repository.
set -euo pipefail
out=${1:-bench/gpu/out/families}
fx=fixtures/hf-families
stage() { node --conditions=@stageml/source --import tsx apps/cli/src/bin.ts stage --cutoff adapter --dtype bf16 --force "$@" > /dev/null; }
for dir in "$fx"/*/; do
  fam=$(basename "$dir")
  [ -f "$dir/config.json" ] || continue
  stage --model "$dir" --out "$out/$fam/base"
  for a in "$dir"adapters/*/; do
    stage --model "$dir" --adapter "$a" --out "$out/$fam/$(basename "$a")"
  done
  echo "staged $fam"
done
