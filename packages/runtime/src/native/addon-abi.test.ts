// The runner ABI check: an addon older than the encoder (a stale prebuilt or STAGEML_CPU_ADDON
// file, without the newer kernels) is detected at load with a coded error instead of failing on
// an instruction it lacks, and the runner refuses an unknown instruction at compile.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, test } from 'vitest';

import { CPU_ADDON_ABI, addonAbiProblem, loadCpuAddon } from './addon.js';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '../../../..');
const dir = mkdtempSync(join(tmpdir(), 'stageml-abi-'));
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

describe('addonAbiProblem', () => {
  test('accepts the ABI the encoder needs', () => {
    expect(addonAbiProblem({ abi: () => CPU_ADDON_ABI })).toBeUndefined();
  });

  test('names an addon without abi() as ABI 1, an older build', () => {
    expect(addonAbiProblem({ isa: () => 'avx2' })).toMatch(new RegExp(`ABI 1, .* needs ABI ${String(CPU_ADDON_ABI)} \\(an older build`));
  });

  test('refuses a newer ABI too', () => {
    expect(addonAbiProblem({ abi: () => CPU_ADDON_ABI + 1 })).toMatch(/a newer build/);
  });
});

describe('the loaded addon', () => {
  test('reports the encoder ABI', () => {
    expect(loadCpuAddon().abi?.()).toBe(CPU_ADDON_ABI);
  }, 240_000);

  test('refuses an instruction it does not know at compile (RT_UNSUPPORTED)', () => {
    // version 1, no symbols/exprs/values, one instruction of op 999 with no operands.
    const ints = Int32Array.from([1, 0, 0, 0, 1, 0, 0, 0, 0, 999, 0, 0, 0, 0]);
    expect(() => loadCpuAddon().compile(ints, new Float64Array(0), [])).toThrow(expect.objectContaining({ code: 'RT_UNSUPPORTED' }) as Error);
  });

  test('a stale STAGEML_CPU_ADDON file (no abi()) is RT_BACKEND_UNAVAILABLE at executor creation, not a crash later', () => {
    const stale = join(dir, 'stale-addon.cjs');
    writeFileSync(stale, "module.exports = { compile() { throw new Error('unreachable'); }, run() {}, threads: (n) => n, isa: () => 'avx2' };\n");
    const script = "import('@stageml/runtime').then((r) => { try { r.createCpuNativeExecutor({ threads: 1 }); console.log('loaded'); } catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); } });";
    const r = spawnSync(process.execPath, ['--conditions=@stageml/source', '--import', 'tsx', '-e', script], { cwd: root, env: { ...process.env, STAGEML_CPU_ADDON: stale }, encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { code: string; message: string };
    expect(out.code).toBe('RT_BACKEND_UNAVAILABLE');
    expect(out.message).toMatch(new RegExp(`ABI 1, .*needs ABI ${String(CPU_ADDON_ABI)}`));
  }, 60_000);
});
