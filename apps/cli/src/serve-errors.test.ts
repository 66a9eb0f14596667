// Issue 19, rows 12 and 13: CLI failures are coded errors with exit codes, never stack traces.
import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createNetServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { ExitCode, runCli } from './index.js';

const base = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/base', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'stageml-cli-errors-'));
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

async function run(args: string[]): Promise<{ code: number; err: string }> {
  const err: string[] = [];
  const code = await runCli(args, { out: () => undefined, err: (l) => err.push(l) });
  return { code, err: err.join('\n') };
}
const noStack = (s: string): void => {
  expect(s).not.toMatch(/\n\s+at |internal error/);
};

describe('CLI failures are coded (issue 19)', () => {
  it('row 12: a safetensors header nested 5,000 deep is ST_BAD_JSON, exit 3', async () => {
    const model = join(dir, 'deep');
    cpSync(base, model, { recursive: true });
    const json = `{"a":${'['.repeat(5000)}${']'.repeat(5000)}}`;
    const header = Buffer.from(json);
    const len = Buffer.alloc(8);
    len.writeUInt32LE(header.length, 0);
    writeFileSync(join(model, 'model.safetensors'), Buffer.concat([len, header]));
    const r = await run(['generate', '--model', model, '--ids', '1,2', '--max-new-tokens', '1', '--executor', 'interpreter']);
    expect(r.err).toContain('ST_BAD_JSON');
    expect(r.code).toBe(ExitCode.INVALID_INPUT);
    noStack(r.err);
  });

  it('row 13: serve with a bad port, a bad host, a missing directory or a port in use exits coded', async () => {
    const bad = await run(['serve', '--model', base, '--port', '70000']);
    expect(bad.code).toBe(ExitCode.USAGE);
    noStack(bad.err);
    const host = await run(['serve', '--model', base, '--host', '999.1.1.1']);
    expect(host.code).toBe(ExitCode.USAGE);
    noStack(host.err);
    const missing = await run(['serve', '--model', base, '--adapters', '/nonexistent-stageml']);
    expect(missing.code).toBe(ExitCode.IO);
    expect(missing.err).toContain('error[CLI_IO]');
    noStack(missing.err);
    const picks = await run(['serve', '--model', base, '--executor-picks', 'sometimes']);
    expect(picks.code).toBe(ExitCode.USAGE);
    expect(picks.err).toContain("expected auto, on or off, got 'sometimes'");
    noStack(picks.err);
    // vLLM flags we do not implement are refused naming what we have, before anything loads.
    for (const [flags, says] of [
      [['--quantization', 'awq'], '--quantize'],
      [['--max-num-seqs', '4', '--max-batch', '8'], 'same setting'],
      [['--enable-auto-tool-choice'], '--tool-call-parser'],
    ] as const) {
      const r = await run(['serve', '--model', base, ...flags]);
      expect(r.code, flags.join(' ')).toBe(ExitCode.USAGE);
      expect(r.err).toContain(says);
      noStack(r.err);
    }
    const noModel = await run(['serve', '--model', '/nonexistent-stageml']);
    expect(noModel.code).toBe(ExitCode.IO);
    noStack(noModel.err);
    const holder = createNetServer();
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', () => { resolve(); }));
    const port = (holder.address() as { port: number }).port;
    try {
      const inUse = await run(['serve', '--model', base, '--host', '127.0.0.1', '--port', String(port), '--executor', 'interpreter']);
      expect(inUse.code).toBe(ExitCode.IO);
      expect(inUse.err).toContain('error[CLI_LISTEN]');
      expect(inUse.err).toContain('already in use');
      noStack(inUse.err);
      // --pack-base is taken (the engine loads with its base program's own weights) before the listen fails.
      const packed = await run(['serve', '--model', base, '--pack-base', '--host', '127.0.0.1', '--port', String(port), '--executor', 'interpreter']);
      expect(packed.err).toContain('error[CLI_LISTEN]');
      noStack(packed.err);
    } finally {
      holder.close();
    }
  });
});
