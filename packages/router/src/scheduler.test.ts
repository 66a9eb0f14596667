import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Engine } from '@stageml/engine';
import { beforeAll, describe, expect, it, onTestFinished, vi } from 'vitest';
import { type GenerationRequest, Scheduler, TenantRegistry, parseRouterConfig } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, unknown> & { families: { llama: { adapters: string[] } } };
const ADAPTERS = golden.families.llama.adapters;
const prompt = (model: string, p: number) => (golden[`llama.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)[`prompt${String(p)}`]!;
let lm: Engine;

beforeAll(async () => {
  lm = await Engine.load(`${root}llama/base`);
  for (const a of ADAPTERS) await lm.loadAdapter(`${root}llama/adapters/${a}`);
});

function req(model: string, p: number, extra: Partial<GenerationRequest> = {}): GenerationRequest {
  return {
    tenant: extra.tenant ?? 't',
    adapter: model === 'base' ? undefined : model,
    prompt: prompt(model, p).input_ids,
    maxNewTokens: 12,
    sampling: { greedy: true },
    stopTokens: [],
    padTokenId: 0,
    ...extra,
  };
}

describe('Scheduler', () => {
  it('hands a step\'s tokens to onToken while the next step is in the engine, with the same tokens and order', async () => {
    const s = new Scheduler(lm, { maxBatch: 8 });
    const events: string[] = [];
    const step = lm.step.bind(lm);
    const spy = vi.spyOn(lm, 'step').mockImplementation(async (record) => {
      events.push('step');
      return step(record);
    });
    onTestFinished(() => {
      spy.mockRestore();
    });
    const ids: number[] = [];
    const r = await s.submit(req('base', 0, { maxNewTokens: 5, onToken: (id) => {
      ids.push(id);
      events.push('token');
    } }));
    // Greedy tokens as the golden ones, each heard once, in order, before the request resolves.
    expect(r.newIds).toEqual(prompt('base', 0).greedy_new_ids.slice(0, 5));
    expect(ids).toEqual(r.newIds);
    // Prefill (token 1), then decode steps: token k is heard after the step that takes it as input
    // was started; the last token, with no step after it, when the loop ends.
    expect(events).toEqual(['step', 'step', 'token', 'step', 'token', 'step', 'token', 'step', 'token', 'token']);
  });

  it('applies each row\'s own token constraint in a mixed batch and ends a completed one with stop', async () => {
    /** A constraint allowing the ids `allowed[k]` at step k, finished after the last. */
    const constraint = (allowed: readonly (readonly number[])[]) => {
      const accepted: number[] = [];
      return {
        accepted,
        mask: () => {
          const m = new Uint32Array(64);
          for (const id of allowed[accepted.length] ?? []) m[id >>> 5]! |= 1 << (id & 31);
          return m;
        },
        accept: (id: number) => {
          accepted.push(id);
        },
        get finished() {
          return accepted.length >= allowed.length;
        },
      };
    };
    const s = new Scheduler(lm, { maxBatch: 8 });
    const a = constraint([[5, 6], [7], [9, 10, 11]]);
    const b = constraint([[20], [21], [22], [23], [24]]);
    const [ra, rb, plain] = await Promise.all([
      s.submit(req('base', 0, { sampling: { greedy: true, constraint: a }, maxNewTokens: 12 })),
      s.submit(req(ADAPTERS[0]!, 1, { sampling: { temperature: 1, seed: 3, constraint: b }, maxNewTokens: 12 })),
      s.submit(req('base', 2)),
    ]);
    expect(ra.newIds).toHaveLength(3);
    expect([5, 6]).toContain(ra.newIds[0]);
    expect(ra.newIds[1]).toBe(7);
    expect([9, 10, 11]).toContain(ra.newIds[2]);
    expect(ra.finishReason).toBe('stop');
    expect(a.accepted).toEqual(ra.newIds);
    expect(rb.newIds).toEqual([20, 21, 22, 23, 24]);
    expect(rb.finishReason).toBe('stop');
    expect(plain.newIds).toEqual(prompt('base', 2).greedy_new_ids);
  });

  it('fails only the row whose sampling values the engine refuses, never the requests batched with it (issue 39 item 3)', async () => {
    const s = new Scheduler(lm, { maxBatch: 8 });
    const sampled = { temperature: 1, seed: 7 };
    const good = [0, 1, 2].map((p) => s.submit(req('base', p, { tenant: 'b', sampling: { ...sampled, topK: 5 } })));
    const bad = expect(s.submit(req('base', 3, { tenant: 'a', sampling: { ...sampled, topK: 2 ** 31 } }))).rejects.toThrow(/topK/);
    const outs = await Promise.allSettled(good);
    await bad;
    const goldens = await Promise.all([0, 1, 2].map((p) => new Scheduler(lm).submit(req('base', p, { sampling: { ...sampled, topK: 5 } }))));
    expect(outs.map((r) => (r.status === 'fulfilled' ? r.value.newIds : String(r.reason)))).toEqual(goldens.map((r) => r.newIds));
  });

  it('tells whether a tenant queue has room for all sequences of one request (hasRoom)', () => {
    const s = new Scheduler(lm, { maxQueue: 4 });
    expect(s.hasRoom('t', 4)).toBe(true);
    expect(s.hasRoom('t', 5)).toBe(false);
  });

  it('batches a concurrent mixed load and returns every request its golden tokens', async () => {
    const s = new Scheduler(lm, { maxBatch: 8, isStaged: (a) => a !== 'o-r2' });
    const jobs: Promise<void>[] = [];
    for (const model of ['base', ...ADAPTERS]) {
      for (let p = 0; p < 4; p++) {
        jobs.push(
          s.submit(req(model, p, { tenant: `tenant-${String(p % 2)}` })).then((r) => {
            expect(r.newIds, `${model} prompt${String(p)}`).toEqual(prompt(model, p).greedy_new_ids);
            expect(r.path).toBe(model === 'o-r2' ? 'fallback' : 'staged');
          }),
        );
      }
    }
    await Promise.all(jobs);
    expect(s.snapshot()).toMatchObject({ running: 0, waiting: 0 });
  });

  it('picks where the logits are (decodeSample, prefillSample) unless a row reports log-probabilities, with the same tokens', async () => {
    const sampleSpy = vi.spyOn(lm, 'decodeSample');
    const logitsSpy = vi.spyOn(lm, 'decode');
    const firstSpy = vi.spyOn(lm, 'prefillSample');
    const prefillSpy = vi.spyOn(lm, 'prefillMany');
    onTestFinished(() => {
      sampleSpy.mockRestore();
      logitsSpy.mockRestore();
      firstSpy.mockRestore();
      prefillSpy.mockRestore();
    });
    const s = new Scheduler(lm, { maxBatch: 8 });
    const greedy = await Promise.all([0, 1, 2].map((p) => s.submit(req('base', p))));
    greedy.forEach((r, p) => {
      expect(r.newIds).toEqual(prompt('base', p).greedy_new_ids);
    });
    // Plain greedy rows: an argmax where the logits are (RunOptions.argmax).
    expect(sampleSpy.mock.calls.length).toBeGreaterThan(0);
    expect(sampleSpy.mock.calls.every(([, , rows]) => rows.every((r) => r.temperature === 0 && r.processing === undefined))).toBe(true);
    expect(logitsSpy).not.toHaveBeenCalled();
    // First tokens too: picked by the prefill run that finishes the prompt.
    expect(firstSpy.mock.calls.length).toBeGreaterThan(0);
    expect(prefillSpy).not.toHaveBeenCalled();
    // Greedy rows beside plainly sampled ones: picked where the logits are too (decodeSample, each
    // sampled row drawing from its own stream); a zero penalty is still plain greedy.
    const sampling = { temperature: 0.7, topK: 40, topP: 0.9, seed: 3 } as const;
    sampleSpy.mockClear();
    const mixed = await Promise.all([
      s.submit(req('base', 0)),
      s.submit(req('base', 1, { sampling: { greedy: true, presencePenalty: 0 } })),
      s.submit(req('base', 2, { sampling })),
    ]);
    expect(mixed[0].newIds).toEqual(prompt('base', 0).greedy_new_ids);
    expect(mixed[1].newIds).toEqual(prompt('base', 1).greedy_new_ids);
    expect(sampleSpy.mock.calls.some(([, , rows]) => rows.some((r) => r.temperature === 0.7))).toBe(true);
    expect(logitsSpy).not.toHaveBeenCalled();
    // Penalties and bias travel with their rows (each picker's counts advanced by the picks).
    const penalized = { temperature: 0.9, presencePenalty: 1.5, frequencyPenalty: 0.5, repetitionPenalty: 1.3, promptIds: prompt('base', 1).input_ids, logitBias: { 7: 2 }, seed: 8 } as const;
    sampleSpy.mockClear();
    const processed = await Promise.all([s.submit(req('base', 1, { sampling: penalized })), s.submit(req('base', 3, { sampling: { greedy: true, presencePenalty: 1.5 } }))]);
    expect(sampleSpy.mock.calls.some(([, , rows]) => rows.some((r) => r.processing?.counts !== undefined && r.processing.counts.length > 0))).toBe(true);
    expect(logitsSpy).not.toHaveBeenCalled();
    // A row reporting log-probabilities needs the logits on the host and sends the whole batch
    // through decode: every other row's stream and tokens are the same either way.
    const logprobs = { greedy: true, topLogprobs: 2, onPick: () => undefined } as const;
    const onHost = await Promise.all([
      s.submit(req('base', 0, { sampling: logprobs })),
      s.submit(req('base', 2, { sampling })),
      s.submit(req('base', 1, { sampling: penalized })),
      s.submit(req('base', 3, { sampling: { greedy: true, presencePenalty: 1.5 } })),
    ]);
    expect(logitsSpy).toHaveBeenCalled();
    expect(prefillSpy).toHaveBeenCalled();
    expect(onHost[0].newIds).toEqual(prompt('base', 0).greedy_new_ids);
    expect(onHost[1].newIds).toEqual(mixed[2].newIds);
    expect(onHost[2].newIds).toEqual(processed[0].newIds);
    expect(onHost[3].newIds).toEqual(processed[1].newIds);
    expect(mixed[2].newIds).not.toEqual(prompt('base', 2).greedy_new_ids);
    expect(processed[1].newIds).not.toEqual(prompt('base', 3).greedy_new_ids);
  });

  it('hands the engine one step record per step, decode rows and prefill chunks in one run where the padding allows, with the golden tokens', async () => {
    const merging = await Engine.load(`${root}llama/base`, { stepMergeWaste: 1000 });
    for (const a of ADAPTERS) await merging.loadAdapter(`${root}llama/adapters/${a}`);
    const stepSpy = vi.spyOn(merging, 'step');
    const decodeSpy = vi.spyOn(merging, 'decodeSample');
    const s = new Scheduler(merging, { maxBatch: 8 });
    // Arrivals spread over the first steps: most steps hold running streams and a new prompt.
    const jobs: Promise<void>[] = [];
    for (const [i, model] of ['base', 'qv-r8', 'all-r16', 'base', 'mlp-r4-rslora', 'qv-r8'].entries()) {
      jobs.push(s.submit(req(model, i % 4)).then((r) => { expect(r.newIds, `${model} prompt${String(i % 4)}`).toEqual(prompt(model, i % 4).greedy_new_ids); }));
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    await Promise.all(jobs);
    const st = s.stepStats();
    expect(st.steps).toBe(stepSpy.mock.calls.length);
    expect(st.mergedSteps).toBeGreaterThan(0);
    // Merged steps took one run; the others one per kind present (no lanes here).
    expect(st.engineRuns).toBeLessThan(st.steps + stepSpy.mock.calls.filter(([r]) => r.decode !== undefined && r.prefill !== undefined).length);
    expect(merging.stats()).toMatchObject({ steps: st.steps, mergedSteps: st.mergedSteps });
    // A merged step calls no decode run of its own.
    expect(decodeSpy.mock.calls.length).toBe(stepSpy.mock.calls.filter(([r]) => r.decode !== undefined).length - st.mergedSteps);
  });

  it('takes its defaults from the executor: a GPU budget prefills a burst of arrivals in one step, the CPU one two at a time', async () => {
    const budgets: number[][] = [];
    for (const hints of [{ tokenBudget: 64, maxBatch: 32 }, { tokenBudget: 8192, maxBatch: 256 }]) {
      const getter = vi.spyOn(lm, 'scheduling', 'get').mockReturnValue(hints);
      const stepSpy = vi.spyOn(lm, 'step');
      try {
        const s = new Scheduler(lm);
        const rs = await Promise.all([0, 1, 2, 3, 0, 1, 2, 3].map((p) => s.submit(req('base', p, { maxNewTokens: 2 }))));
        rs.forEach((r, i) => { expect(r.newIds).toEqual(prompt('base', i % 4).greedy_new_ids.slice(0, 2)); });
        budgets.push(stepSpy.mock.calls.map(([r]) => r.prefill?.seqs.length ?? 0));
      } finally {
        getter.mockRestore();
        stepSpy.mockRestore();
      }
    }
    expect(Math.max(...budgets[0]!)).toBeLessThanOrEqual(2);
    expect(Math.max(...budgets[1]!)).toBe(7);
    expect(() => new Scheduler(lm, { maxBatch: 0 })).toThrow(expect.objectContaining({ code: 'ROUTER_BAD_CONFIG' }) as Error);
  });

  it('streams tokens in order and stops at a stop token', async () => {
    const s = new Scheduler(lm);
    const seen: number[] = [];
    const gold = prompt('mlp-r4-rslora', 0).greedy_new_ids;
    const r = await s.submit(req('mlp-r4-rslora', 0, { stopTokens: [2], onToken: (id) => seen.push(id) }));
    expect(r.finishReason).toBe('stop');
    expect(r.newIds).toEqual(gold.slice(0, gold.indexOf(2) + 1));
    expect(seen).toEqual(r.newIds);
  });

  it('rejects work beyond the queue bound without queueing it, and drains', async () => {
    const s = new Scheduler(lm, { maxBatch: 1, maxQueue: 2 });
    const a = s.submit(req('base', 0, { maxNewTokens: 2 }));
    const b = s.submit(req('base', 1, { maxNewTokens: 2 }));
    const c = s.submit(req('base', 2, { maxNewTokens: 2 }));
    expect(() => s.submit(req('base', 3))).toThrow(expect.objectContaining({ code: 'ROUTER_QUEUE_FULL' }) as Error);
    const drained = s.drain();
    expect(() => s.submit(req('base', 3))).toThrow(expect.objectContaining({ code: 'ROUTER_DRAINING' }) as Error);
    await Promise.all([a, b, c, drained]);
    expect(s.snapshot()).toMatchObject({ running: 0, waiting: 0, draining: true });
  });

  it('cancels a waiting request when its signal aborts', async () => {
    const s = new Scheduler(lm, { maxBatch: 1 });
    const first = s.submit(req('base', 0, { maxNewTokens: 3 }));
    const ac = new AbortController();
    const second = s.submit(req('base', 1, { signal: ac.signal }));
    ac.abort();
    await expect(second).rejects.toMatchObject({ code: 'ROUTER_CANCELLED' });
    await first;
  });

  it('admits tenants round-robin under per-tenant caps', async () => {
    const order: string[] = [];
    const s = new Scheduler(lm, { maxBatch: 2, tenantCap: (t) => (t === 'greedy' ? 1 : undefined) });
    const jobs = [
      ...[0, 1, 2].map((p) => s.submit(req('base', p, { tenant: 'greedy', maxNewTokens: 1, onToken: () => order.push('greedy') }))),
      s.submit(req('base', 3, { tenant: 'polite', maxNewTokens: 1, onToken: () => order.push('polite') })),
    ];
    await Promise.all(jobs);
    expect(order.indexOf('polite')).toBeLessThan(2);
  });

  it('bounds each tenant queue on its own: one tenant at its bound does not refuse another', async () => {
    const s = new Scheduler(lm, { maxBatch: 1, maxQueue: 2 });
    const jobs = [0, 1, 2].map((p) => s.submit(req('base', p, { tenant: 'flood', maxNewTokens: 2 })));
    expect(s.isFull('flood')).toBe(true);
    expect(() => s.submit(req('base', 3, { tenant: 'flood' }))).toThrow(expect.objectContaining({ code: 'ROUTER_QUEUE_FULL' }) as Error);
    expect(s.isFull('quiet')).toBe(false);
    jobs.push(s.submit(req('base', 3, { tenant: 'quiet', maxNewTokens: 2 })));
    expect(s.snapshot().waitingByTenant).toEqual({ flood: 2, quiet: 1 });
    await Promise.all(jobs);
  });

  it('shares batch slots by weight', async () => {
    const order: string[] = [];
    const s = new Scheduler(lm, { maxBatch: 4, tenantWeight: (t) => (t === 'heavy' ? 3 : 1) });
    const blocker = s.submit(req('base', 0, { tenant: 'x', maxNewTokens: 1 }));
    const jobs = ['heavy', 'light'].flatMap((tenant) => [0, 1, 2, 3].map((p) => s.submit(req('base', p, { tenant, maxNewTokens: 1, onToken: () => order.push(tenant) }))));
    await Promise.all([blocker, ...jobs]);
    // The first batch after the blocker: 3 slots of 4 to the tenant of weight 3.
    expect(order.slice(0, 4).filter((t) => t === 'heavy')).toHaveLength(3);
  });

  it('fails a request with a bad token with its coded error and keeps serving', async () => {
    const s = new Scheduler(lm);
    await expect(s.submit({ ...req('base', 0), prompt: [1, 9999] })).rejects.toMatchObject({ code: 'MODEL_BAD_TOKEN' });
    expect((await s.submit(req('base', 2))).newIds).toEqual(prompt('base', 2).greedy_new_ids);
  });
});

describe('TenantRegistry', () => {
  const known = { baseModel: 'llama', adapters: new Set(ADAPTERS) };
  const reg = new TenantRegistry(
    parseRouterConfig(JSON.stringify({ version: 1, tenants: [{ name: 'a', api_keys: ['key-aaaaaaaa'], adapters: ['qv-r8'] }, { name: 'b', api_keys: ['key-bbbbbbbb'], adapters: ['o-r2'], base: false }] })).tenants,
  );

  it('routes keys to their tenant and adapter', () => {
    expect(reg.route('key-aaaaaaaa', 'qv-r8', known)).toEqual({ tenant: 'a', adapter: 'qv-r8' });
    expect(reg.route('key-aaaaaaaa', 'llama', known)).toEqual({ tenant: 'a', adapter: undefined });
    expect(reg.visibleModels('key-bbbbbbbb', known)).toEqual(['o-r2']);
  });

  it('refuses missing and unknown keys (401); other tenants adapters and unknown models alike (404)', () => {
    expect(() => reg.route(undefined, 'qv-r8', known)).toThrow(expect.objectContaining({ code: 'ROUTER_UNAUTHORIZED' }) as Error);
    expect(() => reg.route('nope-nope-nope', 'qv-r8', known)).toThrow(expect.objectContaining({ code: 'ROUTER_UNAUTHORIZED' }) as Error);
    expect(() => reg.route('key-aaaaaaaa', 'o-r2', known)).toThrow(expect.objectContaining({ code: 'ROUTER_UNKNOWN_MODEL' }) as Error);
    expect(() => reg.route('key-bbbbbbbb', 'llama', known)).toThrow(expect.objectContaining({ code: 'ROUTER_UNKNOWN_MODEL' }) as Error);
    expect(() => reg.route(undefined, 'gpt-4', known)).toThrow(expect.objectContaining({ code: 'ROUTER_UNAUTHORIZED' }) as Error);
    expect(() => reg.route('key-aaaaaaaa', 'gpt-4', known)).toThrow(expect.objectContaining({ code: 'ROUTER_UNKNOWN_MODEL' }) as Error);
  });

  it('rejects malformed configs naming the field', () => {
    expect(() => parseRouterConfig('{"version": 2, "tenants": []}')).toThrow(expect.objectContaining({ code: 'ROUTER_BAD_CONFIG' }) as Error);
    expect(() => parseRouterConfig('{"version": 1, "tenants": [{"name": "x", "api_keys": ["short"]}]}')).toThrow(/api_keys/);
    expect(() => parseRouterConfig(JSON.stringify({ version: 1, tenants: [{ name: 'x', api_keys: ['k-12345678'] }, { name: 'y', api_keys: ['k-12345678'] }] }))).toThrow(expect.objectContaining({ code: 'ROUTER_BAD_CONFIG' }) as Error);
  });
});
