// CI runs this file (nvcc is on that machine kind): every generated unit must compile for sm_90a
// to PTX and to a cubin, ptxas must report no spills, and the PTX must use tensor cores. The
// register counts ptxas reports are recorded in test/golden/ptxas.json (a file snapshot).
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect } from 'vitest';
import { itWithTool } from '../test/tools.js';
import { CUDA_CASES } from '../test/cases.js';
import { generateCuda } from './generate.js';
import { type NvccResult, type PtxasEntry, compileCudaAsync, parsePtxasReport } from './nvcc.js';

const root = mkdtempSync(join(tmpdir(), 'stageml-nvcc-'));
afterAll(() => {
  rmSync(root, { recursive: true, force: true });
});

function ok(r: NvccResult): string {
  if (r.status !== 'ok') throw new Error(`${r.command.join(' ')}: ${r.status === 'missing' ? r.reason : r.stderr}`);
  return r.stderr;
}

/** A short, stable label for a kernel instantiation (template arguments of the mangled name are long). */
function label(entry: string, i: number): string {
  const kind = /(gemm_kernel|shrink_kernel|expand_kernel)/.exec(entry)?.[1] ?? 'kernel';
  return `${kind}#${String(i)}`;
}

describe('nvcc (sm_90a)', () => {
  itWithTool(
    'nvcc',
    'compiles every generated unit to PTX and cubin with no spills, on tensor cores',
    async () => {
      const report: Record<string, { entries: number; maxRegisters: number; spillBytes: number; registers: Record<string, number> }> = {};
      const units = Object.entries(CUDA_CASES).flatMap(([name, g]) => {
        const dir = join(root, name);
        mkdirSync(dir, { recursive: true });
        const { files } = generateCuda(g);
        for (const [file, text] of Object.entries(files)) writeFileSync(join(dir, file), text);
        return Object.keys(files)
          .filter((f) => f.endsWith('.cu'))
          .map((file) => ({ name, dir, file }));
      });
      await Promise.all(
        units.map(async (u) => {
          const src = join(u.dir, u.file);
          const [ptx, cubin] = await Promise.all([compileCudaAsync(src, `${src}.ptx`, 'ptx'), compileCudaAsync(src, `${src}.cubin`, 'cubin')]);
          ok(ptx);
          const entries: PtxasEntry[] = parsePtxasReport(ok(cubin));
          const text = readFileSync(`${src}.ptx`, 'utf8');
          expect(text, `${u.name}: PTX uses mma.sync`).toMatch(/mma\.sync\.aligned\.m16n8k16/);
          expect(text).toMatch(/ldmatrix\.sync\.aligned/);
          expect(text).toMatch(/cp\.async\.cg\.shared\.global/);
          expect(entries.length).toBeGreaterThan(0);
          for (const e of entries) expect(e.spillStores + e.spillLoads + e.stackFrame, `${u.name} ${e.entry}`).toBe(0);
          report[`${u.name}/${u.file}`] = {
            entries: entries.length,
            maxRegisters: Math.max(...entries.map((e) => e.registers)),
            spillBytes: entries.reduce((s, e) => s + e.spillStores + e.spillLoads, 0),
            registers: Object.fromEntries(entries.map((e, i) => [label(e.entry, i), e.registers])),
          };
        }),
      );
      const sorted = Object.fromEntries(Object.entries(report).sort(([p], [q]) => p.localeCompare(q)));
      await expect(`${JSON.stringify(sorted, null, 2)}\n`).toMatchFileSnapshot('../test/golden/ptxas.json');
    },
    600_000,
  );
});
