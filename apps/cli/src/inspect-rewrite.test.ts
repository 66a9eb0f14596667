import { fileURLToPath } from 'node:url';
import { parseGraph, verifyGraph } from '@stageml/ir';
import { describe, expect, it } from 'vitest';
import { ExitCode } from './index.js';
import { runCaptured as run } from './test-fixtures.js';

const fixture = fileURLToPath(new URL('../../../fixtures/ir/lora-layer.ir', import.meta.url));

interface Report {
  stop: string;
  applied: Record<string, number>;
  log: { rule: string; node: string; before: string; after: string }[];
  estimate: { before: { seconds: number; constantBytes: number }; after: { seconds: number; constantBytes: number } };
  text: string;
}

describe('stageml inspect --rewrite', () => {
  it('merges the LoRA layer at the adapter cutoff and prints the log and the rewritten graph', async () => {
    const r = await run(['inspect', '--rewrite', fixture]);
    expect(r.code).toBe(ExitCode.OK);
    expect(r.out).toContain('rewrite @lora_layer: 1 rewrite(s), fixpoint');
    expect(r.out).toContain('applied: add.merge-lora 1');
    expect(r.out).toContain('[1] add.merge-lora at %y');
    expect(r.out).toContain('      + %y.mul = sml.mul(%y.matmul, %scale) : f32[96, 64]');
    expect(r.out).toContain('      - %y = sml.add(%base, %delta) : f32[batch, 96]');
    expect(r.out).toContain('      + %y = sml.linear(%x, %y.add, %bias) : f32[batch, 96]');
    expect(r.out).toContain('constants: 30080 → 24960 bytes');
    expect(r.out).toMatch(/graph @lora_layer \{[\s\S]*return y = %y\n\}$/);
  });

  it('prints a JSON report whose graph text parses and verifies', async () => {
    const r = await run(['inspect', fixture, '--rewrite', '--json']);
    expect(r.code).toBe(ExitCode.OK);
    const report = JSON.parse(r.out) as Report;
    expect(report.stop).toBe('fixpoint');
    expect(report.applied['add.merge-lora']).toBe(1);
    expect(report.log.map((e) => e.rule)).toEqual(['add.merge-lora']);
    expect(report.estimate.after.seconds).toBeLessThan(report.estimate.before.seconds);
    verifyGraph(parseGraph(report.text));
  });

  it('keeps per-request adapters factored at batch 1 and merges them at batch 4096', async () => {
    const small = JSON.parse((await run(['inspect', fixture, '--rewrite', '--json', '--cutoff', 'base'])).out) as Report;
    expect(Object.values(small.applied).every((n) => n === 0)).toBe(true);
    expect(small.log).toEqual([]);
    const big = JSON.parse((await run(['inspect', fixture, '--rewrite', '--json', '--cutoff', 'base', '--batch', '4096'])).out) as Report;
    // The per-request product B·A is small against 4096 rows of x: the layer becomes one linear
    // (through the LoRA merge, or re-association then the distributive merge).
    expect(big.applied['add.merge-lora']! + big.applied['add.merge-linears']!).toBe(1);
    expect(big.text).toMatch(/%y = sml\.linear\(%x, %[\w.]+, %bias\)/);
  });

  it('respects the memory budget', async () => {
    const r = JSON.parse((await run(['inspect', fixture, '--rewrite', '--json', '--budget', '0'])).out) as Report;
    // Merging only shrinks this layer's constants, so even a zero budget allows it.
    expect(r.applied['add.merge-lora']).toBe(1);
  });

  it('reports an unknown stage with its code and bad flags as usage errors', async () => {
    const stage = await run(['inspect', fixture, '--rewrite', '--cutoff', 'later']);
    expect(stage.code).toBe(ExitCode.INVALID_INPUT);
    expect(stage.err).toContain('error[BTA_UNKNOWN_STAGE]');
    expect((await run(['inspect', fixture, '--rewrite', '--batch', '0'])).code).toBe(ExitCode.USAGE);
    const stray = await run(['inspect', fixture, '--cutoff', 'base']);
    expect(stray.code).toBe(ExitCode.USAGE);
    expect(stray.err).toContain('error[CLI_USAGE]');
  });
});
