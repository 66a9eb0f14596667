import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { ExitCode } from './index.js';
import { runCaptured as run } from './test-fixtures.js';

const fixture = fileURLToPath(new URL('../../../fixtures/ir/lora-layer.ir', import.meta.url));

describe('stageml inspect', () => {
  it('verifies a graph and prints its summary', async () => {
    const r = await run(['inspect', fixture]);
    expect(r.code).toBe(ExitCode.OK);
    expect(r.out).toContain('graph @lora_layer: verified');
    expect(r.out).toContain('x: f32[batch, 64]');
    expect(r.out).toMatch(/linear\s+3/);
  });

  it('prints machine-readable JSON with --json', async () => {
    const r = await run(['inspect', fixture, '--json']);
    const s = JSON.parse(r.out) as { ops: number; flops: string; outputs: { name: string }[] };
    expect(s.ops).toBe(6);
    expect(s.outputs.map((o) => o.name)).toEqual(['y']);
    // 2·64·96 + 96 (base + bias) + 2·64·8 (shrink) + 2·8·96 (expand) + 96 + 96 (scale, add)
    expect(s.flops).toBe('15136*batch');
  });

  it('reports a malformed graph with its code, location and exit code 3', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'stageml-cli-'));
    const bad = join(dir, 'bad.ir');
    writeFileSync(bad, 'graph @g {\n  %x = input : f32[4]\n  %y = sml.matmul(%x, %x) : f32[4]\n  return y = %y\n}\n');
    const r = await run(['inspect', bad]);
    expect(r.code).toBe(ExitCode.INVALID_INPUT);
    expect(r.err).toMatch(/^error\[IR_SHAPE_MISMATCH\]: 3:3/);
  });

  it('reports an unreadable file with exit code 4', async () => {
    const r = await run(['inspect', '/nonexistent/graph.ir']);
    expect(r.code).toBe(ExitCode.IO);
    expect(r.err).toContain('error[CLI_IO]');
  });

  it('rejects unknown commands as usage errors', async () => {
    const r = await run(['frobnicate']);
    expect(r.code).toBe(ExitCode.USAGE);
  });
});

describe('stageml demo', () => {
  it('builds, verifies, prints and re-parses the 7B-shaped graph exactly', async () => {
    const r = await run(['demo', '--json']);
    expect(r.code).toBe(ExitCode.OK);
    const report = JSON.parse(r.out) as { roundTrip: boolean; textBytes: number };
    expect(report.roundTrip).toBe(true);
    expect(report.textBytes).toBeGreaterThan(50_000);
  });
});
