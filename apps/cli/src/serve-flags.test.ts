import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { DOC, withServeFlagTable } from '../../../scripts/serve-flags-doc.js';
import { runCaptured } from './test-fixtures.js';
import { SERVE_FLAGS, flagKey, passThroughOptions, plainHelp, renderServeFlagTable } from './serve-flags.js';

describe('stageml serve flags: one table', () => {
  it('docs/server.md holds the table generated from SERVE_FLAGS (run `pnpm docs:serve-flags` after changing a flag)', () => {
    const text = readFileSync(DOC, 'utf8');
    expect(withServeFlagTable(text)).toBe(text);
    expect(text).toContain(renderServeFlagTable());
  });

  it('`stageml serve --help` lists exactly the table\'s flags, with their help text', async () => {
    const r = await runCaptured(['serve', '--help']);
    const help = r.out.replace(/\s+/g, ' ');
    const listed = [...r.out.matchAll(/^ {2}(--[a-z-]+)/gm)].map((m) => m[1]).filter((f) => f !== '--help');
    expect(listed.sort()).toEqual(SERVE_FLAGS.map((f) => f.spec.split(' ')[0]!).sort());
    for (const f of SERVE_FLAGS) expect(help).toContain(plainHelp(f.help).split(' ').slice(0, 6).join(' '));
  });

  it('passes flags that go through unchanged to the server option the table names', () => {
    expect(flagKey('--max-lora-rank <n>')).toBe('maxLoraRank');
    expect(flagKey('--no-enable-prefix-caching')).toBe('enablePrefixCaching');
    expect(passThroughOptions({ maxLoraRank: 8, shutdownTimeout: 5000, adapterRoot: ['/a'], adapters: '/d', log: true })).toEqual({ maxLoraRank: 8, shutdownTimeoutMs: 5000, adapterRoots: ['/a'], adaptersDir: '/d' });
    expect(new Set(SERVE_FLAGS.map((f) => f.spec.split(' ')[0])).size).toBe(SERVE_FLAGS.length);
  });
});
