// Every error code of every package maps to exactly one error class, and from it to one CLI exit
// code and one HTTP status: the two front ends derive both from the registry in @stageml/ir.
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ERROR_CLASSES, type ErrorClass, StageError, errorCodeInfo } from '@stageml/ir';
import { httpStatusOf, statusOf } from '@stageml/server';
import { describe, expect, it } from 'vitest';
import { ExitCode, exitCodeFor } from './exit-codes.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const errorFiles = ['packages', 'apps'].flatMap((dir) =>
  readdirSync(join(root, dir))
    .map((p) => join(root, dir, p, 'src', 'errors.ts'))
    .filter((f) => {
      try {
        return readFileSync(f, 'utf8').length > 0;
      } catch {
        return false;
      }
    }),
);

/** Every `XCode` object exported by a package's errors.ts: its file and codes. */
async function allCodes(): Promise<{ file: string; table: string; code: string }[]> {
  const out: { file: string; table: string; code: string }[] = [];
  for (const file of errorFiles) {
    const mod = (await import(file)) as Record<string, unknown>;
    for (const [table, value] of Object.entries(mod)) {
      if (!table.endsWith('Code') || typeof value !== 'object' || value === null) continue;
      for (const code of Object.values(value)) if (typeof code === 'string') out.push({ file: file.slice(root.length), table, code });
    }
  }
  return out;
}

describe('error classes', () => {
  it('maps every code of every package to one class, exit code and HTTP status', async () => {
    const codes = await allCodes();
    expect(new Set(codes.map((c) => c.file.split('/')[1])).size).toBeGreaterThanOrEqual(15);
    const owners = new Map<string, string>();
    for (const { file, table, code } of codes) {
      const where = `${file} ${table}`;
      // One owner per code: no two tables declare the same code string.
      expect(owners.get(code) ?? where, code).toBe(where);
      owners.set(code, where);
      const info = errorCodeInfo(code);
      expect(info, `${code} (${where}) is not registered with registerErrorCodes`).toBeDefined();
      const cls = ERROR_CLASSES[info!.class];
      const err = new StageError(code, 'probe');
      expect(exitCodeFor(err), code).toBe(info!.exitCode);
      expect(statusOf(err), code).toBe(info!.httpStatus);
      expect(httpStatusOf(code), code).toBe(info!.httpStatus);
      expect(info!.httpStatus, code).toBeGreaterThanOrEqual(cls.httpRange[0]);
      expect(info!.httpStatus, code).toBeLessThanOrEqual(cls.httpRange[1]);
      if (info!.exitCode !== cls.exitCode) expect(code).toBe('CLI_USAGE');
    }
    // Codes the review found unmapped or disagreeing between the CLI and the server.
    for (const code of ['MOE_BAD_ADAPTER', 'MOE_SHAPE_MISMATCH', 'MOE_BAD_PLAN', 'IR_PARSE_ERROR', 'RT_EVAL_FAILED']) {
      expect(errorCodeInfo(code)?.class, code).toBe('input');
      expect(httpStatusOf(code), code).toBe(400);
    }
  });

  it('names each class in the CLI exit codes', () => {
    const byClass: Record<ErrorClass, number> = { input: ExitCode.INVALID_INPUT, io: ExitCode.IO, unavailable: ExitCode.UNAVAILABLE, internal: ExitCode.INTERNAL };
    for (const [cls, info] of Object.entries(ERROR_CLASSES)) expect(info.exitCode, cls).toBe(byClass[cls as ErrorClass]);
    expect(exitCodeFor(new Error('not coded'))).toBe(ExitCode.INTERNAL);
    expect(statusOf(new Error('not coded'))).toBe(500);
    expect(exitCodeFor(new StageError('NOBODY_REGISTERED_THIS', 'x'))).toBe(ExitCode.INTERNAL);
  });

  it('leaves no raw-string code in sources (every code goes through a typed class)', () => {
    const raw: string[] = [];
    const walk = (dir: string): void => {
      for (const e of readdirSync(dir, { withFileTypes: true })) {
        const p = join(dir, e.name);
        if (e.isDirectory()) walk(p);
        else if (p.endsWith('.ts') && !p.endsWith('.test.ts') && /new StageError\(\s*'/.test(readFileSync(p, 'utf8'))) raw.push(p.slice(root.length));
      }
    };
    for (const dir of ['packages', 'apps']) for (const p of readdirSync(join(root, dir))) walk(join(root, dir, p, 'src'));
    expect(raw).toEqual([]);
  });
});
