// The shipped linux-x64 prebuilt addon: built from the current source (a changed source without a
// rebuild fails here: run `node scripts/build-cpu-prebuilt.mjs`), the files the manifest records,
// the variant choice by CPU flags, loading with no compiler on the machine, every variant this CPU
// runs matching the interpreter, and the best one giving the same bits as a -march=native build.
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, test } from 'vitest';

import { type PrebuiltVariant, cpuFlagSet, pickPrebuiltVariant, readPrebuiltManifest } from './addon.js';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '../../../..');
const source = join(here, '../../native/cpu/stageml_cpu.cpp');
const dir = join(here, '../../native/cpu/prebuilt/linux-x64');
const manifest = readPrebuiltManifest(dir);
const sha = (buf: Buffer): string => createHash('sha256').update(buf).digest('hex');
const linuxX64 = process.platform === 'linux' && process.arch === 'x64';
const cache = mkdtempSync(join(tmpdir(), 'stageml-prebuilt-'));
afterAll(() => {
  rmSync(cache, { recursive: true, force: true });
});

interface ProbeResult {
  build: string;
  isa: string;
  sha256: string;
  worst: number;
}

/** Runs prebuilt-support.ts in a child process with `env` added; its JSON line. */
function probe(env: Record<string, string>): ProbeResult {
  const r = spawnSync(process.execPath, ['--conditions=@stageml/source', '--import', 'tsx', join(here, 'prebuilt-support.ts')], {
    cwd: root,
    env: { ...process.env, STAGEML_CPU_ADDON: '', STAGEML_CPU_BUILD: '', ...env },
    encoding: 'utf8',
  });
  expect(r.status, r.stderr).toBe(0);
  return JSON.parse(r.stdout.trim().split('\n').at(-1)!) as ProbeResult;
}

const hasCompiler = ((): boolean => {
  try {
    execFileSync(process.env['CXX'] ?? 'g++', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

describe('cpu-native prebuilt (linux-x64)', () => {
  test('was built from the current source, and holds the files its manifest records', () => {
    expect(manifest, 'packages/runtime/native/cpu/prebuilt/linux-x64/manifest.json').toBeDefined();
    expect(manifest!.sourceSha256, 'the C++ source changed without a rebuild: run `node scripts/build-cpu-prebuilt.mjs`').toBe(sha(readFileSync(source)));
    expect(manifest!.variants.map((v) => v.isa)).toEqual(['avx512-vnni', 'avx512', 'avx2']);
    for (const v of manifest!.variants) expect(sha(readFileSync(join(dir, v.file))), v.file).toBe(v.sha256);
  });

  test('picks the best variant the CPU flags allow, none without AVX2', () => {
    const variants = manifest!.variants;
    const v3 = ['avx2', 'fma', 'bmi1', 'bmi2', 'f16c', 'movbe'];
    const v4 = [...v3, 'avx512f', 'avx512bw', 'avx512cd', 'avx512dq', 'avx512vl'];
    const pick = (flags: string[]): string | undefined => pickPrebuiltVariant(variants, new Set(flags))?.isa;
    expect(pick([...v4, 'avx512_vnni'])).toBe('avx512-vnni');
    expect(pick(v4)).toBe('avx512');
    expect(pick([...v4.filter((f) => f !== 'avx512bw'), 'avx512_vnni'])).toBe('avx2');
    expect(pick(v3)).toBe('avx2');
    expect(pick(v3.filter((f) => f !== 'fma'))).toBeUndefined();
    expect(pick(['sse4_2', 'avx'])).toBeUndefined();
  });

  const fits: PrebuiltVariant | undefined = linuxX64 && manifest !== undefined ? pickPrebuiltVariant(manifest.variants, cpuFlagSet()) : undefined;

  test.skipIf(fits === undefined)('loads with no C++ compiler on the machine, the best variant for this CPU', () => {
    const r = probe({ CXX: '/nonexistent/g++', STAGEML_NATIVE_CACHE: cache });
    expect(r.build).toBe(`prebuilt ${fits!.isa}`);
    expect(r.isa).toBe(fits!.isa);
    expect(r.worst).toBeLessThan(5e-3);
  });

  test.skipIf(fits === undefined)('every variant this CPU runs matches the interpreter', () => {
    const flags = cpuFlagSet();
    for (const v of manifest!.variants.filter((x) => x.needs.every((f) => flags.has(f)))) {
      const r = probe({ STAGEML_CPU_ADDON: join(dir, v.file) });
      expect([r.build, r.isa]).toEqual(['file', v.isa]);
      expect(r.worst, v.isa).toBeLessThan(5e-3);
    }
  });

  test.skipIf(fits === undefined || !hasCompiler)('gives the same bits as the -march=native build from source', () => {
    const prebuilt = probe({});
    const built = probe({ STAGEML_CPU_BUILD: 'source', STAGEML_NATIVE_CACHE: cache });
    expect(built.build).toBe('source');
    // Same ISA paths (the compiler's native target may not be the shipped one on another CPU).
    if (built.isa === prebuilt.isa) expect(built.sha256).toBe(prebuilt.sha256);
  }, 120_000);
});
