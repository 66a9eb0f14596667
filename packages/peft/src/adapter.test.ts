import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type HostTensor, hostTensor } from '@stageml/ir';
import { SafetensorsFile, writeSafetensors } from '@stageml/safetensors';
import { expectCode } from '@stageml/testkit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type LoraAdapter, PeftCode, PeftError, checkAdapterAgainstBase, loadLoraAdapter } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as { linear: Record<string, { r: number; alpha: number; scaling: number }> };
const LLAMA = { 'qv-r8': 2, 'all-r16': 0.5, 'mlp-r4-rslora': 4, 'o-r2': 16 } as const;
const adapters: Record<string, LoraAdapter> = {};
const baseShapes: Record<'llama' | 'mixtral', Map<string, readonly number[]>> = { llama: new Map(), mixtral: new Map() };
let tmp = '';

beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'peft-adapter-test-'));
  for (const n of ['t0', 't1', 't2', 't3']) adapters[n] = await loadLoraAdapter(`${root}linear/adapters/${n}`);
  for (const n of Object.keys(LLAMA)) adapters[n] = await loadLoraAdapter(`${root}llama/adapters/${n}`);
  for (const n of ['attn-r8', 'experts-r4']) adapters[n] = await loadLoraAdapter(`${root}mixtral/adapters/${n}`);
  for (const base of ['llama', 'mixtral'] as const) {
    const f = await SafetensorsFile.open(`${root}${base}/base/model.safetensors`);
    for (const name of f.names()) baseShapes[base].set(name, f.info(name).shape);
    await f.close();
  }
});

afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

const shapeOf =
  (base: 'llama' | 'mixtral') =>
  (param: string): readonly number[] | undefined =>
    baseShapes[base].get(param);

/** A deterministic f32 tensor of `shape`. */
function t(...shape: number[]): HostTensor {
  const n = shape.reduce((a, b) => a * b, 1);
  return hostTensor('f32', shape, Array.from({ length: n }, (_, i) => ((i % 13) - 6) / 16));
}

let dirs = 0;
/** Writes an adapter directory (config overrides on a valid q/v config, tensors by key without prefix). */
async function writeAdapter(config: Record<string, unknown> | string | undefined, tensors: Record<string, HostTensor> | undefined): Promise<string> {
  const dir = join(tmp, `a${String(dirs++)}`);
  await mkdir(dir);
  if (config !== undefined) {
    const text = typeof config === 'string' ? config : JSON.stringify({ peft_type: 'LORA', r: 8, lora_alpha: 16, target_modules: ['q_proj', 'v_proj'], ...config });
    await writeFile(join(dir, 'adapter_config.json'), text);
  }
  if (tensors !== undefined) {
    await writeSafetensors(join(dir, 'adapter_model.safetensors'), Object.fromEntries(Object.entries(tensors).map(([k, v]) => [`base_model.model.${k}`, v])));
  }
  return dir;
}

const Q0 = 'model.layers.0.self_attn.q_proj';
const V0 = 'model.layers.0.self_attn.v_proj';
const qv = (r: number, rv = r): Record<string, HostTensor> => ({
  [`${Q0}.lora_A.weight`]: t(r, 64),
  [`${Q0}.lora_B.weight`]: t(64, r),
  [`${V0}.lora_A.weight`]: t(rv, 64),
  [`${V0}.lora_B.weight`]: t(32, rv),
});

async function loadCode(dir: string): Promise<PeftError> {
  const e: unknown = await loadLoraAdapter(dir).then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(PeftError);
  return e as PeftError;
}

describe('loadLoraAdapter on the fixtures', () => {
  it('keeps module LoRA beside expert LoRA when target_parameters holds bare names (PEFT 0.21 writes `down_proj` beside `mlp.experts.down_proj`)', async () => {
    // Regression: a bare name's empty module prefix matched every path, so v_proj's factors were
    // taken for parameter factors and the adapter was refused.
    const dir = fileURLToPath(new URL('../../../fixtures/hf-families/qwen3_moe/adapters/experts-r2/', import.meta.url));
    const a = await loadLoraAdapter(dir);
    expect(a.config.targetParameters).toContain('down_proj');
    expect([...a.modules.keys()].sort()).toEqual(['model.layers.0.self_attn.v_proj', 'model.layers.1.self_attn.v_proj']);
    expect(a.parameterFactors.map((f) => [f.module, f.depth]).sort()).toEqual([
      ['model.layers.0.mlp.experts', 0],
      ['model.layers.0.mlp.experts', 1],
    ]);
  });

  it('loads the linear adapters t0..t3 with golden ranks and scalings', () => {
    for (const n of ['t0', 't1', 't2', 't3']) {
      const a = adapters[n]!;
      const m = a.modules.get('proj')!;
      const { r, scaling } = golden.linear[n]!;
      expect([a.name, m.rank, m.scale, m.A.shape, m.B.shape]).toEqual([n, r, scaling, [r, 64], [96, r]]);
      expect(a.bytes).toBe(4 * (r * 64 + 96 * r));
      expect([a.parameterFactors.length, a.overrides.size]).toEqual([0, 0]);
    }
  });

  it('loads the llama adapters onto module paths with scalings α/r (α/√r for rsLoRA)', () => {
    const modules: Record<keyof typeof LLAMA, string[]> = {
      'qv-r8': ['self_attn.q_proj', 'self_attn.v_proj'],
      'all-r16': ['mlp.down_proj', 'mlp.gate_proj', 'mlp.up_proj', 'self_attn.k_proj', 'self_attn.o_proj', 'self_attn.q_proj', 'self_attn.v_proj'],
      'mlp-r4-rslora': ['mlp.down_proj', 'mlp.up_proj'],
      'o-r2': ['self_attn.o_proj'],
    };
    for (const [n, scale] of Object.entries(LLAMA) as [keyof typeof LLAMA, number][]) {
      const a = adapters[n]!;
      const expected = [0, 1].flatMap((l) => modules[n].map((m) => `model.layers.${String(l)}.${m}`));
      expect([...a.modules.keys()].sort()).toEqual(expected.sort());
      for (const m of a.modules.values()) {
        expect(m.scale).toBe(scale);
        expect(m.A.shape[0]).toBe(a.config.r);
        expect(m.B.shape[1]).toBe(a.config.r);
      }
      const bytes = [...a.modules.values()].reduce((s, m) => s + m.A.data.byteLength + m.B.data.byteLength, 0);
      expect(a.bytes).toBe(bytes);
    }
    expect(adapters['qv-r8']!.modules.get('model.layers.1.self_attn.v_proj')!.B.shape).toEqual([32, 8]);
  });

  it('loads the mixtral attention adapter and the expert adapter (target_parameters)', () => {
    const attn = adapters['attn-r8']!;
    expect(attn.modules.size).toBe(6);
    for (const m of attn.modules.values()) expect([m.rank, m.scale]).toEqual([8, 2]);
    const experts = adapters['experts-r4']!;
    expect(experts.modules.size).toBe(0);
    const pf = experts.parameterFactors.map((p) => ({ module: p.module, depth: p.depth, A: p.A.shape, B: p.B.shape }));
    for (const l of [0, 1]) {
      const module = `model.layers.${String(l)}.mlp.experts`;
      // …experts.base_layer… wraps gate_up_proj (depth 1); …experts… wraps down_proj (depth 0). r·E = 4·4.
      expect(pf).toContainEqual({ module, depth: 1, A: [16, 64], B: [192, 16] });
      expect(pf).toContainEqual({ module, depth: 0, A: [16, 96], B: [64, 16] });
    }
    expect(pf).toHaveLength(4);
    expect(experts.bytes).toBe(53_248);
  });

  it('names the adapter after its directory unless told otherwise', async () => {
    const a = await loadLoraAdapter(`${root}llama/adapters/o-r2`, { name: 'tenant-7' });
    expect([a.name, a.dir]).toEqual(['tenant-7', `${root}llama/adapters/o-r2`]);
  });
});

describe('loadLoraAdapter on written adapters', () => {
  it('applies rank_pattern and alpha_pattern per module', async () => {
    const a = await loadLoraAdapter(await writeAdapter({ rank_pattern: { q_proj: 4 }, alpha_pattern: { [V0]: 32 } }, qv(4, 8)));
    expect([a.modules.get(Q0)!.rank, a.modules.get(Q0)!.alpha, a.modules.get(Q0)!.scale]).toEqual([4, 16, 4]);
    expect([a.modules.get(V0)!.rank, a.modules.get(V0)!.alpha, a.modules.get(V0)!.scale]).toEqual([8, 32, 4]);
  });

  it('scales by α/√r with use_rslora', async () => {
    const a = await loadLoraAdapter(await writeAdapter({ r: 4, use_rslora: true }, qv(4)));
    expect(a.modules.get(Q0)!.scale).toBe(8);
  });

  it('loads lora_B biases and modules_to_save overrides', async () => {
    const tensors = { ...qv(8), [`${Q0}.lora_B.bias`]: t(64), 'score.modules_to_save.default.weight': t(3, 64), 'lm_head.modules_to_save.weight': t(10, 64) };
    const a = await loadLoraAdapter(await writeAdapter({ lora_bias: true, modules_to_save: ['score', 'lm_head'] }, tensors));
    expect(a.modules.get(Q0)!.biasB?.shape).toEqual([64]);
    expect(a.modules.get(V0)!.biasB).toBeUndefined();
    expect([...a.overrides.keys()].sort()).toEqual(['lm_head.weight', 'score.weight']);
  });

  it('refuses a wrong rank with PEFT_SHAPE_MISMATCH naming the module', async () => {
    const e = await loadCode(await writeAdapter({ r: 8 }, qv(4)));
    expect(e.code).toBe(PeftCode.SHAPE_MISMATCH);
    expect(e.message).toMatch(/model\.layers\.0\.self_attn\.(q|v)_proj/);
    expect(e.message).toContain('expected rank 8');
  });

  it('refuses lora_A without lora_B (and the reverse) with PEFT_BAD_TENSORS', async () => {
    const only = (k: 'A' | 'B'): Record<string, HostTensor> => ({ [`${Q0}.lora_${k}.weight`]: k === 'A' ? t(8, 64) : t(64, 8) });
    for (const k of ['A', 'B'] as const) {
      const e = await loadCode(await writeAdapter({}, only(k)));
      expect(e.code).toBe(PeftCode.BAD_TENSORS);
      expect(e.message).toContain(Q0);
    }
    const e = await loadCode(await writeAdapter({}, { ...qv(8), [`${Q0}.lora_A.bias`]: t(8) }));
    expect(e.code).toBe(PeftCode.BAD_TENSORS);
  });

  it('refuses DoRA, embedding LoRA and non-LoRA adapters with PEFT_UNSUPPORTED', async () => {
    expect((await loadCode(await writeAdapter({ use_dora: true }, qv(8)))).message).toContain('use_dora');
    expect((await loadCode(await writeAdapter({}, { ...qv(8), [`${Q0}.lora_magnitude_vector`]: t(64) }))).code).toBe(PeftCode.BAD_TENSORS); // a magnitude without use_dora
    expect((await loadCode(await writeAdapter({}, { 'model.embed_tokens.lora_embedding_A': t(8, 512) }))).code).toBe(PeftCode.UNSUPPORTED);
    expect((await loadCode(await writeAdapter({ peft_type: 'LOHA' }, qv(8)))).code).toBe(PeftCode.UNSUPPORTED);
  });

  it('reports bad configs as PEFT_BAD_CONFIG naming the field', async () => {
    expect((await loadCode(await writeAdapter('{ not json', qv(8)))).code).toBe(PeftCode.BAD_CONFIG);
    const e = await loadCode(await writeAdapter({ lora_alpha: 'sixteen' }, qv(8)));
    expect([e.code, e.message.includes("'lora_alpha'")]).toEqual([PeftCode.BAD_CONFIG, true]);
  });

  it('reports missing files as PEFT_IO and unreadable tensors as PEFT_BAD_TENSORS', async () => {
    expect((await loadCode(await writeAdapter(undefined, qv(8)))).code).toBe(PeftCode.IO);
    expect((await loadCode(await writeAdapter({}, undefined))).code).toBe(PeftCode.IO);
    expect((await loadCode(join(tmp, 'no-such-adapter'))).code).toBe(PeftCode.IO);
    const dir = await writeAdapter({}, undefined);
    await writeFile(join(dir, 'adapter_model.safetensors'), new Uint8Array([1, 2, 3]));
    expect((await loadCode(dir)).code).toBe(PeftCode.BAD_TENSORS);
  });
});

describe('checkAdapterAgainstBase', () => {
  it('accepts every llama adapter against the llama base', () => {
    for (const n of Object.keys(LLAMA)) checkAdapterAgainstBase(adapters[n]!, shapeOf('llama'));
  });

  it('accepts the mixtral attention adapter against the llama base: the dims agree, so shapes cannot tell', () => {
    // Both tiny bases have hidden 64 and 2 KV heads of 16 (q/o [64, 64], v [32, 64]).
    for (const m of ['q_proj', 'v_proj', 'o_proj']) {
      expect(baseShapes.llama.get(`model.layers.0.self_attn.${m}.weight`)).toEqual(baseShapes.mixtral.get(`model.layers.0.self_attn.${m}.weight`));
    }
    checkAdapterAgainstBase(adapters['attn-r8']!, shapeOf('llama'));
    checkAdapterAgainstBase(adapters['attn-r8']!, shapeOf('mixtral'));
  });

  it('refuses a lora_B with the wrong output dim, naming the key and both shapes', async () => {
    const a = await loadLoraAdapter(await writeAdapter({}, { ...qv(8), [`${Q0}.lora_B.weight`]: t(32, 8) }));
    const e = expectCode(() => {
      checkAdapterAgainstBase(a, shapeOf('llama'));
    }, PeftCode.SHAPE_MISMATCH);
    expect(e.message).toContain(`'${Q0}.lora_B.weight' is [32, 8]`);
    expect(e.message).toContain(`'${Q0}.weight' is [64, 64]`);
  });

  it('refuses a lora_A with the wrong input dim', async () => {
    const down = 'model.layers.0.mlp.down_proj';
    const a = await loadLoraAdapter(await writeAdapter({ target_modules: ['down_proj'] }, { [`${down}.lora_A.weight`]: t(8, 64), [`${down}.lora_B.weight`]: t(64, 8) }));
    const e = expectCode(() => {
      checkAdapterAgainstBase(a, shapeOf('llama'));
    }, PeftCode.SHAPE_MISMATCH);
    expect(e.message).toContain('[8, 64]');
    expect(e.message).toContain('[64, 176]');
  });

  it('refuses a module the base lacks with PEFT_UNKNOWN_MODULE', async () => {
    const q5 = 'model.layers.5.self_attn.q_proj';
    const a = await loadLoraAdapter(await writeAdapter({}, { [`${q5}.lora_A.weight`]: t(8, 64), [`${q5}.lora_B.weight`]: t(64, 8) }));
    expect(
      expectCode(() => {
        checkAdapterAgainstBase(a, shapeOf('llama'));
      }, PeftCode.UNKNOWN_MODULE).message,
    ).toContain(q5);
  });

  it('checks overrides by shape and existence', async () => {
    const ok = await loadLoraAdapter(await writeAdapter({ modules_to_save: ['lm_head'] }, { ...qv(8), 'lm_head.modules_to_save.default.weight': t(512, 64) }));
    checkAdapterAgainstBase(ok, shapeOf('llama'));
    const wrong = await loadLoraAdapter(await writeAdapter({ modules_to_save: ['lm_head'] }, { ...qv(8), 'lm_head.modules_to_save.default.weight': t(500, 64) }));
    expectCode(() => {
      checkAdapterAgainstBase(wrong, shapeOf('llama'));
    }, PeftCode.SHAPE_MISMATCH);
    const unknown = await loadLoraAdapter(await writeAdapter({ modules_to_save: ['score'] }, { ...qv(8), 'score.modules_to_save.default.weight': t(3, 64) }));
    expectCode(() => {
      checkAdapterAgainstBase(unknown, shapeOf('llama'));
    }, PeftCode.UNKNOWN_MODULE);
  });

  it('reads base weights as [in, out] with fan_in_fan_out', async () => {
    const a = await loadLoraAdapter(await writeAdapter({ fan_in_fan_out: true, target_modules: ['v_proj'] }, { [`${V0}.lora_A.weight`]: t(8, 64), [`${V0}.lora_B.weight`]: t(32, 8) }));
    checkAdapterAgainstBase(a, (p) => (p === `${V0}.weight` ? [64, 32] : undefined));
    expectCode(() => {
      checkAdapterAgainstBase(a, shapeOf('llama'));
    }, PeftCode.SHAPE_MISMATCH);
  });
});
