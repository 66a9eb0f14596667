// The torch worker's op table (native/stageml_torch/ops.py `OPS`) against the registry: every op
// either has a worker handler or is a composite the executor expands before sending
// (`TORCH_WORKER_COMPOSITES` names the composites the worker handles). Reads the Python source, so
// it runs without torch.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { COMPOSITE_OPS, OP_KEYS } from '@stageml/ir';
import { describe, expect, it } from 'vitest';

import { TORCH_WORKER_COMPOSITES, torchCapabilities } from './executor.js';
import { NATIVE_DIR } from './test-support.js';

/** The keys of ops.py's `OPS = { ... }` table. */
function workerOps(): Set<string> {
  const src = readFileSync(join(NATIVE_DIR, 'stageml_torch', 'ops.py'), 'utf8');
  const start = src.indexOf('\nOPS = {');
  expect(start, 'ops.py defines OPS').toBeGreaterThan(0);
  const body = src.slice(start, src.indexOf('\n}', start));
  return new Set([...body.matchAll(/^\s+"(\w+)":/gm)].map((m) => m[1]!));
}

describe('the torch worker op table', () => {
  it('handles every registry op, or the executor expands it (a composite it does not fuse)', () => {
    const ops = workerOps();
    const missing = OP_KEYS.filter((k) => !ops.has(k) && !(COMPOSITE_OPS.includes(k) && !TORCH_WORKER_COMPOSITES.has(k)));
    expect(missing).toEqual([]);
  });

  it('fuses only composites the worker has handlers for, the serving ops among them', () => {
    const ops = workerOps();
    for (const k of TORCH_WORKER_COMPOSITES) expect(ops.has(k), k).toBe(true);
    for (const cuda of [false, true]) {
      expect(torchCapabilities(cuda).fuses?.has('loraBank')).toBe(true);
      expect(torchCapabilities(cuda).fuses?.has('cachedAttention')).toBe(true);
    }
    expect(torchCapabilities(true).devicePicks).toBe(true);
  });
});
