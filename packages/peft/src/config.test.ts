import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { expectCode } from '@stageml/testkit';
import { describe, expect, it } from 'vitest';
import { PeftCode, alphaFor, matchPatternKey, parseLoraConfig, rankFor, scalingFor, targetsModule } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const fixtureConfig = (dir: string): string => readFileSync(`${root}${dir}/adapter_config.json`, 'utf8');

/** A minimal valid config with overrides, as PEFT would write it. */
function cfg(over: Record<string, unknown> = {}): string {
  return JSON.stringify({ peft_type: 'LORA', r: 8, lora_alpha: 16, target_modules: ['q_proj', 'v_proj'], ...over });
}

describe('parseLoraConfig', () => {
  it('parses every fixture config PEFT 0.21 wrote', () => {
    const expected: Record<string, { r: number; alpha: number; rslora: boolean; targets: unknown; params: string[] }> = {
      'linear/adapters/t0': { r: 1, alpha: 2, rslora: false, targets: ['proj'], params: [] },
      'linear/adapters/t3': { r: 16, alpha: 64, rslora: false, targets: ['proj'], params: [] },
      'llama/adapters/qv-r8': { r: 8, alpha: 16, rslora: false, targets: ['q_proj', 'v_proj'], params: [] },
      'llama/adapters/mlp-r4-rslora': { r: 4, alpha: 8, rslora: true, targets: ['up_proj', 'down_proj'], params: [] },
      'llama/adapters/o-r2': { r: 2, alpha: 32, rslora: false, targets: ['o_proj'], params: [] },
      'mixtral/adapters/experts-r4': { r: 4, alpha: 8, rslora: false, targets: [], params: ['experts.gate_up_proj', 'experts.down_proj'] },
    };
    for (const [dir, e] of Object.entries(expected)) {
      const c = parseLoraConfig(fixtureConfig(dir));
      expect({ r: c.r, alpha: c.loraAlpha, rslora: c.useRslora, targets: c.targetModules, params: c.targetParameters }, dir).toEqual(e);
      expect(c).toMatchObject({ rankPattern: {}, alphaPattern: {}, fanInFanOut: false, bias: 'none', loraBias: false, modulesToSave: [], layersToTransform: undefined, baseModel: undefined });
    }
  });

  it('parses use_dora and trainable_token_indices (a list means embed_tokens)', () => {
    expect(parseLoraConfig(cfg({ use_dora: true })).useDora).toBe(true);
    expect(parseLoraConfig(cfg({ use_dora: false })).useDora).toBe(false);
    expect(parseLoraConfig(cfg({ trainable_token_indices: [3, 5] })).trainableTokenIndices).toEqual({ embed_tokens: [3, 5] });
    expect(parseLoraConfig(cfg({ trainable_token_indices: { lm_head: [1] } })).trainableTokenIndices).toEqual({ lm_head: [1] });
    expectCode(() => parseLoraConfig(cfg({ trainable_token_indices: [-1] })), PeftCode.BAD_CONFIG);
  });

  it('refuses non-LoRA PEFT types with PEFT_UNSUPPORTED naming the type', () => {
    for (const t of ['LOHA', 'IA3', 'ADALORA', 7]) {
      expect(expectCode(() => parseLoraConfig(cfg({ peft_type: t })), PeftCode.UNSUPPORTED).message).toContain(JSON.stringify(t));
    }
  });

  it('reports text that is not JSON as PEFT_BAD_CONFIG', () => {
    expectCode(() => parseLoraConfig('{"r": 8,'), PeftCode.BAD_CONFIG);
    expect(expectCode(() => parseLoraConfig('null'), PeftCode.BAD_CONFIG).message).toContain('(root)');
  });

  it('names the field of a missing or mistyped value (PEFT_BAD_CONFIG)', () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ r: '8' }, "'r'"],
      [{ r: 0 }, "'r'"],
      [{ r: 2.5 }, "'r'"],
      [{ lora_alpha: null }, "'lora_alpha'"],
      [{ use_rslora: 'yes' }, "'use_rslora'"],
      [{ target_modules: 5 }, "'target_modules'"],
      [{ rank_pattern: { q_proj: 0 } }, "'rank_pattern.q_proj'"],
      [{ alpha_pattern: { q_proj: 'x' } }, "'alpha_pattern.q_proj'"],
      [{ layers_to_transform: [-1] }, "'layers_to_transform.0'"],
      [{ bias: 'sometimes' }, "'bias'"],
      [{ fan_in_fan_out: 1 }, "'fan_in_fan_out'"],
    ];
    for (const [over, field] of cases) {
      expect(expectCode(() => parseLoraConfig(cfg(over)), PeftCode.BAD_CONFIG).message, JSON.stringify(over)).toContain(field);
    }
    const missing = JSON.parse(cfg()) as Record<string, unknown>;
    delete missing['r'];
    expect(expectCode(() => parseLoraConfig(JSON.stringify(missing)), PeftCode.BAD_CONFIG).message).toContain("'r'");
  });

  it('requires something to adapt', () => {
    expectCode(() => parseLoraConfig(cfg({ target_modules: [] })), PeftCode.BAD_CONFIG);
    expectCode(() => parseLoraConfig(cfg({ target_modules: null, target_parameters: [] })), PeftCode.BAD_CONFIG);
    expect(parseLoraConfig(cfg({ target_modules: null, target_parameters: ['experts.down_proj'] })).targetParameters).toEqual(['experts.down_proj']);
  });

  it('normalizes nullish patterns and single values', () => {
    const c = parseLoraConfig(cfg({ rank_pattern: null, alpha_pattern: null, layers_to_transform: 1, layers_pattern: 'layers', modules_to_save: null }));
    expect(c).toMatchObject({ rankPattern: {}, alphaPattern: {}, layersToTransform: [1], layersPattern: ['layers'], modulesToSave: [] });
  });
});

describe('matchPatternKey', () => {
  it('prefers an exact key, else the first key that is a dotted suffix (regex allowed)', () => {
    const keys = ['q_proj', 'model.layers.1.self_attn.q_proj', 'layers\\.0\\..*_proj'];
    expect(matchPatternKey(keys, 'model.layers.1.self_attn.q_proj')).toBe('model.layers.1.self_attn.q_proj');
    expect(matchPatternKey(keys, 'model.layers.0.self_attn.q_proj')).toBe('q_proj');
    expect(matchPatternKey(keys, 'model.layers.0.self_attn.v_proj')).toBe('layers\\.0\\..*_proj');
    expect(matchPatternKey(keys, 'model.layers.1.self_attn.v_proj')).toBeUndefined();
    // A suffix must start at a component boundary.
    expect(matchPatternKey(['q_proj'], 'model.layers.0.self_attn.xq_proj')).toBeUndefined();
    expect(matchPatternKey(['self_attn.q_proj'], 'model.layers.0.self_attn.q_proj')).toBe('self_attn.q_proj');
  });

  it('treats a key that is not a valid regex literally', () => {
    expect(matchPatternKey(['q_proj('], 'a.q_proj(')).toBe('q_proj(');
  });

  it('refuses a rank_pattern or alpha_pattern key that is no regex at load, naming the field (issue 39)', () => {
    expect(() => parseLoraConfig(cfg({ rank_pattern: { '(((': 4 } }), 'a/adapter_config.json')).toThrow(/PEFT_BAD_CONFIG|rank_pattern\.\(\(\(.*not a valid regular expression/);
    expect(() => parseLoraConfig(cfg({ alpha_pattern: { 'q_proj[': 4 } }))).toThrow(/alpha_pattern\.q_proj\[.*not a valid regular expression/);
    expect(() => parseLoraConfig(cfg({ rank_pattern: { 'layers\\.0\\..*_proj': 4 } }))).not.toThrow();
  });
});

describe('rankFor / alphaFor / scalingFor', () => {
  const c = parseLoraConfig(cfg({ rank_pattern: { q_proj: 4, 'model.layers.1.self_attn.v_proj': 2 }, alpha_pattern: { v_proj: 32 } }));

  it('applies rank_pattern and alpha_pattern per module, defaulting to r and lora_alpha', () => {
    const q0 = 'model.layers.0.self_attn.q_proj';
    const v0 = 'model.layers.0.self_attn.v_proj';
    const v1 = 'model.layers.1.self_attn.v_proj';
    const k0 = 'model.layers.0.self_attn.k_proj';
    expect([rankFor(c, q0), rankFor(c, v0), rankFor(c, v1), rankFor(c, k0)]).toEqual([4, 8, 2, 8]);
    expect([alphaFor(c, q0), alphaFor(c, v0), alphaFor(c, v1), alphaFor(c, k0)]).toEqual([16, 32, 32, 16]);
    expect([scalingFor(c, q0), scalingFor(c, v0), scalingFor(c, v1), scalingFor(c, k0)]).toEqual([4, 4, 16, 2]);
  });

  it('scales by α/√r with use_rslora', () => {
    const r = parseLoraConfig(cfg({ use_rslora: true, rank_pattern: { q_proj: 4 } }));
    expect(scalingFor(r, 'model.layers.0.self_attn.q_proj')).toBe(16 / 2);
    expect(scalingFor(r, 'model.layers.0.self_attn.v_proj')).toBeCloseTo(16 / Math.sqrt(8), 12);
  });

  it('gives the llama fixture scalings α/r (α/√r for rsLoRA)', () => {
    const s = (dir: string, m: string): number => scalingFor(parseLoraConfig(fixtureConfig(`llama/adapters/${dir}`)), m);
    expect(s('qv-r8', 'model.layers.0.self_attn.q_proj')).toBe(2);
    expect(s('all-r16', 'model.layers.1.mlp.down_proj')).toBe(0.5);
    expect(s('mlp-r4-rslora', 'model.layers.0.mlp.up_proj')).toBe(4);
    expect(s('o-r2', 'model.layers.1.self_attn.o_proj')).toBe(16);
  });
});

describe('targetsModule', () => {
  const q = (l: number): string => `model.layers.${String(l)}.self_attn.q_proj`;
  const v = (l: number): string => `model.layers.${String(l)}.self_attn.v_proj`;
  const k = (l: number): string => `model.layers.${String(l)}.self_attn.k_proj`;

  it('matches list entries against the whole name or its trailing components', () => {
    const c = parseLoraConfig(cfg({ target_modules: ['q_proj', 'self_attn.v_proj'] }));
    expect([targetsModule(c, q(0)), targetsModule(c, v(1)), targetsModule(c, k(0))]).toEqual([true, true, false]);
    expect(targetsModule(c, 'model.layers.0.self_attn.xq_proj')).toBe(false);
    expect(targetsModule(c, 'q_proj')).toBe(true);
  });

  it('matches a regex string against the whole name only', () => {
    const c = parseLoraConfig(cfg({ target_modules: '.*\\.(q|v)_proj' }));
    expect([targetsModule(c, q(0)), targetsModule(c, v(1)), targetsModule(c, k(0))]).toEqual([true, true, false]);
    expect(targetsModule(parseLoraConfig(cfg({ target_modules: 'q_proj' })), q(0))).toBe(false);
    expect(targetsModule(parseLoraConfig(cfg({ target_modules: '.*layers\\.1\\..*' })), k(1))).toBe(true);
  });

  it('excludes exclude_modules (list or regex)', () => {
    const list = parseLoraConfig(cfg({ exclude_modules: ['layers.1.self_attn.q_proj'] }));
    expect([targetsModule(list, q(0)), targetsModule(list, q(1)), targetsModule(list, v(1))]).toEqual([true, false, true]);
    const re = parseLoraConfig(cfg({ exclude_modules: '.*layers\\.0\\..*' }));
    expect([targetsModule(re, q(0)), targetsModule(re, v(0)), targetsModule(re, q(1))]).toEqual([false, false, true]);
  });

  it('keeps only the layers in layers_to_transform (int or list, optional layers_pattern)', () => {
    const one = parseLoraConfig(cfg({ layers_to_transform: 1 }));
    expect([targetsModule(one, q(0)), targetsModule(one, q(1)), targetsModule(one, v(1))]).toEqual([false, true, true]);
    const list = parseLoraConfig(cfg({ layers_to_transform: [0, 2] }));
    expect([0, 1, 2].map((l) => targetsModule(list, q(l)))).toEqual([true, false, true]);
    const pattern = parseLoraConfig(cfg({ layers_to_transform: [3], layers_pattern: 'h' }));
    expect(targetsModule(pattern, 'transformer.h.3.attn.q_proj')).toBe(true);
    expect(targetsModule(pattern, 'transformer.h.2.attn.q_proj')).toBe(false);
    // The layer index is the number after the layer container, never an expert index.
    expect(targetsModule(parseLoraConfig(cfg({ target_modules: ['up_proj'], layers_to_transform: [1] })), 'model.layers.2.mlp.experts.1.up_proj')).toBe(false);
    expect(targetsModule(pattern, 'lm_head.q_proj')).toBe(false);
  });

  it('treats an empty layers_to_transform as every layer, as PEFT does (regression)', () => {
    const c = parseLoraConfig(cfg({ layers_to_transform: [] }));
    expect(c.layersToTransform).toBeUndefined();
    expect([targetsModule(c, q(0)), targetsModule(c, q(5))]).toEqual([true, true]);
  });

  it('applies layers_to_transform only to list entries matched by suffix, as PEFT does (regression)', () => {
    const exact = parseLoraConfig(cfg({ target_modules: [q(0), 'v_proj'], layers_to_transform: [1] }));
    expect([targetsModule(exact, q(0)), targetsModule(exact, v(0)), targetsModule(exact, v(1))]).toEqual([true, false, true]);
  });

  it('never targets modules_to_save modules (regression)', () => {
    const c = parseLoraConfig(cfg({ target_modules: ['q_proj', 'score'], modules_to_save: ['score'] }));
    expect([targetsModule(c, 'score'), targetsModule(c, 'model.score'), targetsModule(c, q(0))]).toEqual([false, false, true]);
  });
});
