// `--adapters` accepts one adapter directory as well as a directory of them, and says why when a
// directory is neither (it used to find nothing, silently).
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createServer } from '@stageml/server';
import { describe, expect, it } from 'vitest';
import { ExitCode } from './index.js';
import { fixture as repoFixture, runCaptured as run } from './test-fixtures.js';

const fixture = (p: string): string => repoFixture(`peft-tiny/${p}`);

describe('--adapters with one adapter directory', () => {
  const dir = mkdtempSync(join(tmpdir(), 'stageml-adapters-'));

  it('plan: plans that adapter alone', async () => {
    const r = await run(['plan', '--model', fixture('llama/base'), '--adapters', fixture('llama/adapters/qv-r8'), '--budget', '64KiB', '--out', join(dir, 'plan.json'), '--json']);
    expect(r.err).toBe('');
    expect(r.code).toBe(ExitCode.OK);
    const summary = JSON.parse(r.out) as { rows: { adapter: string }[] };
    expect(new Set(summary.rows.map((row) => row.adapter))).toEqual(new Set(['qv-r8']));
  });

  it('plan: a directory with no adapters is PEFT_BAD_CONFIG saying what was expected', async () => {
    const r = await run(['plan', '--model', fixture('llama/base'), '--adapters', dir, '--budget', '64KiB', '--out', join(dir, 'none.json')]);
    expect(r.code).toBe(ExitCode.INVALID_INPUT);
    expect(r.err).toContain('error[PEFT_BAD_CONFIG]');
    expect(r.err).toContain('adapter_config.json');
  });

  it('serve: loads that adapter under its directory name', async () => {
    const server = await createServer({ modelDir: fixture('llama/base'), modelName: 'llama', adaptersDir: fixture('llama/adapters/qv-r8'), padTokenId: 0 });
    try {
      expect(server.lm.adapterNames).toEqual(['qv-r8']);
    } finally {
      await server.shutdown();
    }
  });
});
