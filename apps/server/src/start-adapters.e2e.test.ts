import { cpSync, mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { createServer } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/', import.meta.url));

describe('adapters loaded at start (--adapters DIR)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'stageml-start-adapters-'));
  afterAll(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  it('starts with a malformed adapter among five, serves the other four and reports the bad one on one line', async () => {
    for (const name of ['qv-r8', 'all-r16', 'mlp-r4-rslora', 'o-r2']) cpSync(join(root, 'adapters', name), join(dir, name), { recursive: true });
    mkdirSync(join(dir, 'broken'));
    writeFileSync(join(dir, 'broken', 'adapter_config.json'), '{"peft_type": "LORA", "r": ');
    const lines: string[] = [];
    const server = await createServer({ modelDir: join(root, 'base'), modelName: 'llama', adaptersDir: dir, padTokenId: 0, warn: (l) => lines.push(l) });
    try {
      const base = await server.listen('127.0.0.1', 0);
      const models = (await (await fetch(`${base}/v1/models`)).json()) as { data: { id: string }[] };
      expect(models.data.map((m) => m.id).sort()).toEqual(['all-r16', 'llama', 'mlp-r4-rslora', 'o-r2', 'qv-r8']);
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatch(/^adapter 'broken' skipped: error\[PEFT_[A-Z_]+\]: /);
      const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'o-r2', prompt: [1, 2, 3], max_tokens: 3, temperature: 0 }) });
      expect(r.status).toBe(200);
      const bad = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'broken', prompt: [1, 2, 3], max_tokens: 3 }) });
      expect(bad.status).toBe(404);
    } finally {
      await server.shutdown();
    }
  });

  it('still refuses to start when the one adapter named is malformed', async () => {
    const one = join(dir, 'broken');
    await expect(createServer({ modelDir: join(root, 'base'), modelName: 'llama', adaptersDir: one, padTokenId: 0, warn: () => undefined })).rejects.toMatchObject({ code: expect.stringMatching(/^PEFT_/) });
  });
});
