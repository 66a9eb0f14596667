import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { createServer } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/', import.meta.url));

describe('program provenance at start', () => {
  it("logs one JSON line per prepared program: the staging pipeline's report (serving lattice, cutoff base)", async () => {
    const lines: string[] = [];
    const server = await createServer({ modelDir: join(root, 'base'), modelName: 'llama', padTokenId: 0, log: (l) => lines.push(l), warn: () => undefined });
    try {
      // One line per prepared program; besides them only the prefix-caching line (where its KV lives).
      const programs = lines.filter((l) => l.startsWith('program '));
      expect(programs).toHaveLength(4);
      expect(lines.filter((l) => !l.startsWith('program ')).map((l) => l.split(' ')[0])).toEqual(['prefix']);
      const reports = programs.map((l) => JSON.parse(l.slice('program '.length)) as { form: string; cutoff: string; lattice: string; specialize: { residualOps: number; residualInputs: number } });
      expect(reports.map((r) => r.form).sort()).toEqual(['base', 'gathered', 'grouped', 'single']);
      for (const r of reports) {
        expect(r.cutoff).toBe('base');
        expect(r.lattice).toContain('adapter');
        expect(r.specialize.residualOps).toBeGreaterThan(0);
        expect(r.specialize.residualInputs).toBeGreaterThan(0); // counted: the names stay in Engine.programReport
      }
    } finally {
      await server.shutdown();
    }
  });
});
