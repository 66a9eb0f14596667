import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { GraphBuilder, type HostTensor, graphToJson, hostTensor, interpret } from '@stageml/ir';
import { describe, expect, it } from 'vitest';

import { writeBundle } from '../bundle.js';
import { CacheLostError, RuntimeCode } from '../errors.js';
import { argmaxRows, inputChanged } from '../executor.js';
import { interpreterExecutor } from '../interpreter-executor.js';
import { specialize } from '../specialize.js';
import { FrameDecoder, createTorchExecutor, encodeFrame } from './index.js';
import { describeWithTorch, useCpuTorchExecutor } from './test-support.js';

const NATIVE = fileURLToPath(new URL('../../../../native', import.meta.url));

const samples: Record<string, HostTensor> = {
  f64: hostTensor('f64', [2], [1.5, -2.25]),
  f32: hostTensor('f32', [2, 2], [1, 2, 3, 4]),
  f16: hostTensor('f16', [1], [0.5]),
  bf16: hostTensor('bf16', [3], [1, -1, 2]),
  i64: hostTensor('i64', [2], [2 ** 40, -3]),
  i32: hostTensor('i32', [1], [-7]),
  i8: hostTensor('i8', [2], [-128, 127]),
  u8: hostTensor('u8', [1], [255]),
  bool: hostTensor('bool', [2], [1, 0]),
  empty: hostTensor('f32', [0, 4], []),
};

describe('torch worker frames', () => {
  it('round-trips every dtype, delivered one byte at a time', () => {
    const bytes = Buffer.concat([...encodeFrame({ op: 'a', n: 1 }, samples), ...encodeFrame({ op: 'b' })]);
    const d = new FrameDecoder();
    const frames = [];
    for (const b of bytes) {
      d.push(Buffer.from([b]));
      for (let f = d.next(); f !== undefined; f = d.next()) frames.push(f);
    }
    expect(frames.map((f) => f.header['op'])).toEqual(['a', 'b']);
    expect(d.buffered).toBe(0);
    for (const [k, t] of Object.entries(samples)) {
      const got = frames[0]!.tensors[k]!;
      expect({ dtype: got.dtype, shape: got.shape, data: Array.from(got.data) }).toEqual({ dtype: t.dtype, shape: t.shape, data: Array.from(t.data) });
    }
  });

  it('decodes frames however the bytes are split: many in one chunk, chunks of every size, a frame ending where a chunk does', () => {
    const one = Buffer.concat(encodeFrame({ op: 'a' }, samples));
    const stream = Buffer.concat([one, ...encodeFrame({ op: 'b' }), one, ...encodeFrame({ op: 'c' }, { x: samples['f64']! })]);
    const check = (frames: { header: Record<string, unknown>; tensors: Record<string, HostTensor> }[]): void => {
      expect(frames.map((f) => f.header['op'])).toEqual(['a', 'b', 'a', 'c']);
      for (const i of [0, 2]) for (const [k, t] of Object.entries(samples)) expect(Array.from(frames[i]!.tensors[k]!.data), k).toEqual(Array.from(t.data));
      expect(Array.from(frames[3]!.tensors['x']!.data)).toEqual([1.5, -2.25]);
    };
    for (const size of [stream.byteLength, one.byteLength, 3, 7, 64, 1000]) {
      const d = new FrameDecoder();
      const frames = [];
      for (let o = 0; o < stream.byteLength; o += size) {
        d.push(Buffer.from(stream.subarray(o, o + size)));
        for (let f = d.next(); f !== undefined; f = d.next()) frames.push(f);
      }
      check(frames);
      expect(d.buffered).toBe(0);
    }
  });

  it('rejects a tensor whose byte count does not fit its shape, and a header that is not JSON', () => {
    const [len, body] = encodeFrame({ op: 'x' }, { t: samples['f32']! });
    const head = JSON.parse(body!.toString('utf8')) as { tensors: { nbytes: number }[] };
    head.tensors[0]!.nbytes = 12;
    const bad = Buffer.from(JSON.stringify(head));
    const l2 = Buffer.alloc(4);
    l2.writeUInt32LE(bad.byteLength, 0);
    const d = new FrameDecoder();
    d.push(Buffer.concat([l2, bad, Buffer.alloc(12)]));
    expect(() => d.next()).toThrow(expect.objectContaining({ code: RuntimeCode.WORKER_FAILED }));
    expect(len!.readUInt32LE(0)).toBe(body!.byteLength);
    const d2 = new FrameDecoder();
    const junk = Buffer.from('{nope');
    const l3 = Buffer.alloc(4);
    l3.writeUInt32LE(junk.byteLength, 0);
    d2.push(Buffer.concat([l3, junk]));
    expect(() => d2.next()).toThrow(/header is not JSON/);
  });

  it('refuses tensors that are not in their host storage', () => {
    expect(() => encodeFrame({}, { t: { dtype: 'f32', shape: [2], data: new Float64Array(2) } })).toThrow(expect.objectContaining({ code: RuntimeCode.BAD_VALUE }));
  });
});

describe('torch executor availability', () => {
  it('is RT_BACKEND_UNAVAILABLE with an install hint when the interpreter is missing or lacks torch', async () => {
    for (const python of ['/nonexistent/python3', '/bin/false']) {
      await expect(createTorchExecutor({ python })).rejects.toMatchObject({ code: RuntimeCode.BACKEND_UNAVAILABLE, hint: expect.stringContaining('apt-get install python3 python3-torch') });
    }
  });

  it('names why each interpreter could not start the worker, and keeps a failed start out of the log', async () => {
    // An interpreter without torch: the worker's import fails before it answers. No separate
    // `import torch` check runs first; the worker's own start is the check.
    const dir = mkdtempSync(join(tmpdir(), 'stageml-notorch-'));
    const fake = join(dir, 'python3');
    writeFileSync(fake, "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n", { mode: 0o755 });
    const logged: string[] = [];
    const err: unknown = await createTorchExecutor({ python: fake, log: (l) => logged.push(l) }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: RuntimeCode.BACKEND_UNAVAILABLE, hint: expect.stringContaining('apt-get install python3 python3-torch') });
    expect((err as Error).message).toContain(`${fake}: ModuleNotFoundError: No module named 'torch'`);
    expect(logged).toEqual([]);
    const missing: unknown = await createTorchExecutor({ python: '/nonexistent/python3' }).catch((e: unknown) => e);
    expect((missing as Error).message).toContain('/nonexistent/python3: not found');
  });

  it('is RT_BACKEND_UNAVAILABLE when the stageml_torch package is not found', async () => {
    await expect(createTorchExecutor({ packageDir: '/nonexistent' })).rejects.toMatchObject({ code: RuntimeCode.BACKEND_UNAVAILABLE });
  });
});

/** Sends raw frames to a fresh worker and collects its replies until it exits. */
async function talk(python: string, frames: Buffer[], env: Record<string, string> = {}): Promise<{ replies: Record<string, unknown>[]; code: number | null }> {
  const child = spawn(python, ['-m', 'stageml_torch.worker', '--device', 'cpu'], { env: { ...process.env, PYTHONPATH: NATIVE, ...env }, stdio: ['pipe', 'pipe', 'ignore'] });
  const d = new FrameDecoder();
  const replies: Record<string, unknown>[] = [];
  child.stdout.on('data', (c: Buffer) => {
    d.push(c);
    for (let f = d.next(); f !== undefined; f = d.next()) replies.push(f.header);
  });
  for (const f of frames) child.stdin.write(f);
  child.stdin.end();
  const code = await new Promise<number | null>((r) => {
    child.on('exit', (c) => {
      r(c);
    });
  });
  return { replies, code };
}

describeWithTorch('torch worker protocol', () => {
  const torch = useCpuTorchExecutor();

  it('answers hello, refuses unknown requests and handles with coded errors, and exits at end of input', async () => {
    const frames = [encodeFrame({ op: 'hello', id: 1 }), encodeFrame({ op: 'fly', id: 2 }), encodeFrame({ op: 'run', id: 3, handle: 99 })].flat();
    const { replies, code } = await talk(torch().info.python, frames);
    expect(code).toBe(0);
    expect(replies[0]).toMatchObject({ ok: true, id: 1, protocol: 6, device: 'cpu' });
    expect(replies[1]).toMatchObject({ ok: false, id: 2, code: 'RT_WORKER_FAILED' });
    expect(replies[2]).toMatchObject({ ok: false, id: 3, code: 'RT_DISPOSED' });
  }, 60_000);

  it('starts the interpreter once: the worker itself is the check that it has torch', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'stageml-py-'));
    const calls = join(dir, 'calls');
    const wrapper = join(dir, 'python3');
    writeFileSync(wrapper, `#!/bin/sh\necho "$*" >> '${calls}'\nexec '${torch().info.python}' "$@"\n`, { mode: 0o755 });
    const ex = await createTorchExecutor({ python: wrapper, device: 'cpu' });
    try {
      expect(ex.info.python).toBe(wrapper);
      expect(readFileSync(calls, 'utf8').trim().split('\n')).toEqual(['-m stageml_torch.worker --device cpu']);
    } finally {
      await ex.close();
    }
  }, 60_000);

  it('refuses a device torch does not see, naming it', async () => {
    await expect(createTorchExecutor({ device: 'cuda:99' })).rejects.toMatchObject({ code: RuntimeCode.BACKEND_UNAVAILABLE, message: expect.stringContaining("'cuda:99'") });
    await expect(createTorchExecutor({ device: 'tpu' })).rejects.toMatchObject({ code: RuntimeCode.BACKEND_UNAVAILABLE });
  }, 60_000);

  it('runs a loraBankLinear op as one kernel step when asked (STAGEML_TORCH_FUSE=1), with the same result', async () => {
    const b = new GraphBuilder('bank');
    const x = b.input('x', ['bf16', ['n', 1, 8]]);
    b.output('y', b.loraBankLinear('gathered', x, b.param('W', ['bf16', [4, 8]]), b.param('A', ['bf16', [2, 2, 8]]), b.param('B', ['bf16', [2, 2, 4]]), b.input('slot', ['i64', ['n']])));
    const g = b.build();
    const rnd = (shape: number[]) => hostTensor('bf16', shape, Array.from({ length: shape.reduce((m, d) => m * d, 1) }, (_, i) => Math.round(Math.sin(i + shape[0]!) * 64) / 64));
    const weights = { W: rnd([4, 8]), A: rnd([2, 2, 8]), B: rnd([2, 2, 4]) };
    const inputs = { x: rnd([3, 1, 8]), slot: hostTensor('i64', [3], [1, 0, 1]) };
    const frames = [encodeFrame({ op: 'prepare', id: 1, graph: graphToJson(g) }, weights), encodeFrame({ op: 'run', id: 2, handle: 1 }, inputs)].flat();
    for (const fuse of ['0', '1']) {
      const { replies } = await talk(torch().info.python, frames, { STAGEML_TORCH_FUSE: fuse });
      // On the CPU the kernel declines (no stream module): the linear and the op's table entry run.
      expect(replies[0]).toMatchObject({ ok: true, fusedSlotLinears: fuse === '1' ? 1 : 0 });
      expect(replies[1]).toMatchObject({ ok: true });
    }
    const p = await torch().prepare(g, weights);
    expect((await p.run(inputs))['y']).toBeAllclose(interpret(g, { inputs, weights })['y']!, { rtol: 2e-2, atol: 2e-2 });
    p.dispose();
  }, 60_000);

  it('returns an output reduced to its rows\' argmax where asked (RunOptions.argmax), as argmaxRows reads the values', async () => {
    const b = new GraphBuilder('pick');
    const x = b.input('x', ['f32', ['r', 5]]);
    b.output('logits', b.mul(x, b.constant([1], 'f32', [])));
    b.output('ids', b.cast(x, 'i64'));
    const g = b.build();
    const p = await torch().prepare(g);
    // ties (the lowest index), NaN later (never picked), NaN first (kept), all -inf, +inf
    const rows = [
      [1, 3, 3, 2, 0],
      [1, NaN, 0.5, 4, 4],
      [NaN, 9, 9, 1, 0],
      [-Infinity, -Infinity, -Infinity, -Infinity, -Infinity],
      [0, -1, Infinity, NaN, Infinity],
    ];
    const input = { x: hostTensor('f32', [5, 5], rows.flat()) };
    const full = await p.run(input);
    const reduced = await p.run(input, { argmax: ['logits'] });
    expect(reduced['logits']).toMatchObject({ dtype: 'i64', shape: [5] });
    expect(argmaxRows(reduced['logits']!)).toEqual([1, 3, 0, 0, 2]);
    expect(argmaxRows(full['logits']!)).toEqual([1, 3, 0, 0, 2]);
    expect(Array.from(reduced['ids']!.data)).toEqual(Array.from(full['ids']!.data));
    for (const bad of ['ids', 'nope']) await expect(p.run(input, { argmax: [bad] })).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE, message: expect.stringContaining(`argmax names '${bad}'`) });
    // In-process executors return the values; argmaxRows reads them the same way.
    const local = await interpreterExecutor.prepare(g);
    expect(argmaxRows((await local.run(input, { argmax: ['logits'] }))['logits']!)).toEqual([1, 3, 0, 0, 2]);
    p.dispose();
  }, 60_000);

  it('reports a truncated frame and exits non-zero', async () => {
    const [len, body] = encodeFrame({ op: 'hello' });
    const { replies, code } = await talk(torch().info.python, [len!, body!.subarray(0, 3)]);
    expect(code).toBe(1);
    expect(replies[0]).toMatchObject({ ok: false, code: 'RT_WORKER_FAILED' });
  }, 60_000);

  it('loads a bundle from Python (stageml_torch.bundle) with constants and external parameters', async () => {
    const b = new GraphBuilder('affine');
    const x = b.input('x', ['f32', ['n', 3]]);
    const w = b.param('w', ['f32', [2, 3]]);
    const bias = b.param('bias', ['f32', [2]]);
    b.output('y', b.linear(x, w, bias));
    const g = b.build();
    const dir = join(mkdtempSync(join(tmpdir(), 'stageml-torch-bundle-')), 'b');
    const wv = hostTensor('f32', [2, 3], [1, 2, 3, 4, 5, 6]);
    // w is static (a constant), bias dynamic (an external parameter supplied at load).
    const result = specialize(g, { annotations: { params: { w: 'static', bias: 'dynamic' } }, cutoff: 'static', values: { get: (n) => (n === 'w' ? wv : undefined) } });
    await writeBundle(dir, result);
    writeFileSync(join(dir, 'residual.json'), JSON.stringify(graphToJson(result.residual)));
    const script = [
      'import json, sys, torch',
      'from stageml_torch.bundle import load_bundle',
      'p = load_bundle(sys.argv[1], "cpu", external={"bias": torch.tensor([0.5, -1.0])})',
      'y = p.run({"x": torch.tensor([[1.0, 0.0, -1.0]])})["y"]',
      'print(json.dumps(y.tolist()))',
      'try:\n    load_bundle(sys.argv[1], "cpu")\nexcept Exception as e:\n    print(e.code)',
    ].join('\n');
    const r = spawnSync(torch().info.python, ['-c', script, dir], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: NATIVE } });
    expect(r.stderr).toBe('');
    const [y, code] = r.stdout.trim().split('\n');
    const want = interpret(g, { inputs: { x: hostTensor('f32', [1, 3], [1, 0, -1]) }, weights: { w: wv, bias: hostTensor('f32', [2], [0.5, -1]) } })['y']!;
    expect(JSON.parse(y!)).toEqual([Array.from(want.data)]);
    expect(code).toBe('RT_MISSING_WEIGHT');
  }, 60_000);

  it('keeps parameters resident across runs and maps failures to coded errors, leaving the graph usable', async () => {
    const b = new GraphBuilder('emb');
    const table = b.param('table', ['f32', [4, 3]]);
    const ids = b.input('ids', ['i64', ['n']]);
    b.output('y', b.gather(table, ids));
    const g = b.build();
    const weights = { table: hostTensor('f32', [4, 3], Array.from({ length: 12 }, (_, i) => i)) };
    const p = await torch().prepare(g, weights);
    const good = { ids: hostTensor('i64', [2], [3, 0]) };
    expect(Array.from((await p.run(good))['y']!.data)).toEqual(Array.from(interpret(g, { inputs: good, weights })['y']!.data));
    await expect(p.run({ ids: hostTensor('i64', [1], [7]) })).rejects.toMatchObject({ code: RuntimeCode.EVAL_FAILED, message: expect.stringContaining('gather') });
    await expect(p.run({ ids: hostTensor('f32', [1], [0]) })).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE });
    await expect(p.run({})).rejects.toMatchObject({ code: RuntimeCode.MISSING_INPUT });
    expect(Array.from((await p.run(good))['y']!.data)).toEqual([9, 10, 11, 0, 1, 2]);
    p.dispose();
    await expect(p.run(good)).rejects.toMatchObject({ code: RuntimeCode.DISPOSED });
    await expect(torch().prepare(g, {})).rejects.toMatchObject({ code: RuntimeCode.MISSING_WEIGHT });
  }, 60_000);

  it('keeps resident inputs in the worker between runs: sent once, refreshed after inputChanged, re-sent after a failed run', async () => {
    const b = new GraphBuilder('resident');
    const table = b.input('table', ['f32', [4, 3]]);
    const ids = b.input('ids', ['i64', ['n']]);
    b.output('y', b.gather(table, ids));
    const p = await torch().prepare(b.build());
    const data = Float32Array.from({ length: 12 }, (_, i) => i);
    const t: HostTensor = { dtype: 'f32', shape: [4, 3], data };
    const resident = new Set(['table']);
    const run = async (n: number) => Array.from((await p.run({ table: t, ids: hostTensor('i64', [1], [n]) }, { resident }))['y']!.data);
    expect(await run(1)).toEqual([3, 4, 5]);
    // Changed in place without telling: the worker still holds the copy it was sent (the contract).
    data[3] = 100;
    expect(await run(1)).toEqual([3, 4, 5]);
    // Told: the next run sends it again.
    inputChanged(data);
    expect(await run(1)).toEqual([100, 4, 5]);
    // A failing run that carried a new copy: the next run sends it again rather than referring to it.
    data[4] = 200;
    inputChanged(data);
    await expect(run(9)).rejects.toMatchObject({ code: RuntimeCode.EVAL_FAILED });
    expect(await run(1)).toEqual([100, 200, 5]);
    // Without `resident`, every run sends its inputs.
    data[5] = 300;
    expect(Array.from((await p.run({ table: t, ids: hostTensor('i64', [1], [1]) }))['y']!.data)).toEqual([100, 200, 300]);
    p.dispose();
  }, 60_000);
  it('names an unchanged resident map by residentSame (the map sent again only when it changes), and a map never sent is a protocol error', async () => {
    const b = new GraphBuilder('resident-same');
    const ids = b.input('ids', ['i64', ['n']]);
    const names = Array.from({ length: 24 }, (_, i) => `model.layers.${String(i)}.self_attn.q_proj.lora_A`);
    let y = b.gather(b.input(names[0]!, ['f32', [4, 3]]), ids);
    for (const n of names.slice(1)) y = b.add(y, b.gather(b.input(n, ['f32', [4, 3]]), ids));
    b.output('y', y);
    const g = b.build();
    const p = await torch().prepare(g);
    const datas = names.map((_, i) => Float32Array.from({ length: 12 }, (_, j) => i + j));
    const inputs: Record<string, HostTensor> = Object.fromEntries(names.map((n, i) => [n, { dtype: 'f32', shape: [4, 3], data: datas[i]! }]));
    const resident = new Set(names);
    const run = async (n: number): Promise<{ y: number[]; header: number }> => {
      const before = torch().traffic();
      const out = await p.run({ ...inputs, ids: hostTensor('i64', [1], [n]) }, { resident });
      const after = torch().traffic();
      return { y: Array.from(out['y']!.data), header: after.sentBytes - before.sentBytes - (after.sentTensorBytes - before.sentTensorBytes) };
    };
    const want = (n: number): number[] => [0, 1, 2].map((j) => names.reduce((a, _, i) => a + i + 3 * n + j, 0));
    const first = await run(1); // stores every table
    const second = await run(2); // names them all by id
    const third = await run(0); // the same map: residentSame
    expect([first.y, second.y, third.y]).toEqual([want(1), want(2), want(0)]);
    expect(third.header).toBeLessThan(second.header / 4);
    // A changed table goes again (stored), then the new map is named once more, then the same map.
    datas[5]![3] = datas[5]![3]! + 100;
    inputChanged(datas[5]!);
    const changed = await run(1);
    const named = await run(1);
    const again = await run(1);
    // Row 1 of table 5 holds element 3: the first column of the gathered row.
    const bumped = want(1).map((v, j) => (j === 0 ? v + 100 : v));
    expect([changed.y, named.y, again.y]).toEqual([bumped, bumped, bumped]);
    expect(again.header).toBeLessThan(named.header / 4);
    // After a failed run the map is sent whole again, and runs go on right.
    await expect(run(9)).rejects.toMatchObject({ code: RuntimeCode.EVAL_FAILED });
    const after = await run(2);
    expect(after.header).toBeGreaterThan(again.header * 4);
    p.dispose();
    // A raw run that names a map its program never received.
    const frames = [encodeFrame({ op: 'prepare', id: 1, graph: graphToJson(g) }), encodeFrame({ op: 'run', id: 2, handle: 1, residentSame: true }, { ids: hostTensor('i64', [1], [0]) })].flat();
    const { replies } = await talk(torch().info.python, frames);
    expect(replies[1]).toMatchObject({ ok: false, id: 2, code: 'RT_WORKER_FAILED', message: expect.stringContaining('residentSame') });
  }, 60_000);
  it('feeds inputs from caches held on the worker (RunOptions.caches): appended from outputs and tails, restored when lost, bad requests coded', async () => {
    const b = new GraphBuilder('cached');
    const past = b.input('past', ['f32', ['batch', 'past', 2]]);
    const mask = b.input('mask', ['f32', ['batch', 'past + seq']]);
    const x = b.input('x', ['f32', ['batch', 'seq', 2]]);
    const fresh = b.mul(x, b.constant([1], 'f32', []));
    b.output('all', b.concat([past, fresh], 1));
    b.output('mask_seen', b.mul(mask, b.constant([1], 'f32', [])));
    b.output('new', fresh);
    const p = await torch().prepare(b.build());
    const caches = torch().caches;
    const streams = [{ input: 'past', from: 'new', pad: -1 }, { input: 'mask', from: undefined, pad: -9 }];
    const lost = (): never => {
      throw new Error('restore is called only for a cache the worker lacks');
    };
    const a = caches.open();
    const c = caches.open();
    const r1 = await p.run({ x: hostTensor('f32', [1, 2, 2], [1, 2, 3, 4]), mask: hostTensor('f32', [1, 2], [0, 5]) }, { caches: { streams, rows: [{ id: a, length: 0, append: [0, 2], restore: lost }] } });
    expect(Array.from(r1['all']!.data)).toEqual([1, 2, 3, 4]);
    // Row a reads its 2 positions; row c (new) is padded; each appends its one new position.
    const r2 = await p.run({ x: hostTensor('f32', [2, 1, 2], [5, 6, 7, 8]), mask: hostTensor('f32', [2, 1], [1, 2]) }, { caches: { streams, rows: [{ id: a, length: 2, append: [0, 1], restore: lost }, { id: c, length: 0, append: [0, 1], restore: lost }] } });
    expect(r2['all']!.shape).toEqual([2, 3, 2]);
    expect(Array.from(r2['all']!.data)).toEqual([1, 2, 3, 4, 5, 6, -1, -1, -1, -1, 7, 8]);
    expect(Array.from(r2['mask_seen']!.data)).toEqual([0, 5, 1, -9, -9, 2]);
    // The caller's copy is longer than the worker's: restore() re-sends it.
    let restored = 0;
    const restore = () => {
      restored++;
      return { past: hostTensor('f32', [2, 2], [10, 11, 12, 13]), mask: hostTensor('f32', [2], [0, 0]) };
    };
    const r3 = await p.run({ x: hostTensor('f32', [1, 1, 2], [0, 0]), mask: hostTensor('f32', [1, 1], [0]) }, { caches: { streams, rows: [{ id: c, length: 2, append: [0, 1], restore }] } });
    expect(restored).toBe(1);
    expect(Array.from(r3['all']!.data)).toEqual([10, 11, 12, 13, 0, 0]);
    // Rows in another order (the worker re-stages its batch): each still reads its own cache.
    const r4 = await p.run({ x: hostTensor('f32', [2, 1, 2], [9, 9, 8, 8]), mask: hostTensor('f32', [2, 1], [3, 4]) }, { caches: { streams, rows: [{ id: c, length: 3, append: [0, 1], restore: lost }, { id: a, length: 3, append: [0, 1], restore: lost }] } });
    expect(Array.from(r4['all']!.data)).toEqual([10, 11, 12, 13, 0, 0, 9, 9, 1, 2, 3, 4, 5, 6, 8, 8]);
    expect(Array.from(r4['mask_seen']!.data)).toEqual([0, 0, 0, 3, 0, 5, 1, 4]);
    // One row alone (a leaves the staged batch and keeps its positions), then a again.
    const r5 = await p.run({ x: hostTensor('f32', [1, 1, 2], [7, 7]), mask: hostTensor('f32', [1, 1], [0]) }, { caches: { streams, rows: [{ id: c, length: 4, append: [0, 1], restore: lost }] } });
    expect(Array.from(r5['all']!.data)).toEqual([10, 11, 12, 13, 0, 0, 9, 9, 7, 7]);
    const r6 = await p.run({ x: hostTensor('f32', [1, 1, 2], [6, 6]), mask: hostTensor('f32', [1, 1], [0]) }, { caches: { streams, rows: [{ id: a, length: 4, append: [0, 1], restore: lost }] } });
    expect(Array.from(r6['all']!.data)).toEqual([1, 2, 3, 4, 5, 6, 8, 8, 6, 6]);
    const bad = async (rows: Parameters<typeof p.run>[1], inputs: Record<string, HostTensor> = { x: hostTensor('f32', [1, 1, 2], [0, 0]), mask: hostTensor('f32', [1, 1], [0]) }) => p.run(inputs, rows);
    await expect(bad({ caches: { streams, rows: [{ id: a, length: 5, append: [0, 1], restore: lost }, { id: a, length: 5, append: [0, 1], restore: lost }] } })).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE, message: expect.stringContaining('two rows') });
    await expect(bad({ caches: { streams: [{ input: 'nope', from: 'new', pad: 0 }], rows: [{ id: a, length: 5, append: [0, 1], restore: lost }] } })).rejects.toMatchObject({ code: RuntimeCode.UNKNOWN_INPUT });
    await expect(bad({ caches: { streams, rows: [{ id: a, length: 1, append: [0, 1], restore: () => ({}) }] } })).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE, message: expect.stringContaining('restore') });
    await expect(bad({ caches: { streams, rows: [{ id: a, length: 5, append: [0, 1], restore: lost }] } }, { x: hostTensor('f32', [1, 1, 2], [0, 0]) })).rejects.toMatchObject({ code: RuntimeCode.MISSING_INPUT });
    caches.release([a, c]);
    await expect(bad({ caches: { streams, rows: [{ id: a, length: 5, append: [0, 1], restore: lost }] } })).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE, message: expect.stringContaining('released') });
    p.dispose();
  }, 60_000);

  it('leaves omitted outputs on the worker (RunOptions.omit) while its caches append them; a lost cache without restore is RT_CACHE_LOST and changes nothing', async () => {
    const b = new GraphBuilder('omitting');
    const past = b.input('past', ['f32', ['batch', 'past', 2]]);
    const x = b.input('x', ['f32', ['batch', 'seq', 2]]);
    const fresh = b.mul(x, b.constant([2], 'f32', []));
    b.output('all', b.concat([past, fresh], 1));
    b.output('new', fresh);
    const p = await torch().prepare(b.build());
    const caches = torch().caches;
    const streams = [{ input: 'past', from: 'new', pad: 0 }];
    const a = caches.open();
    const step = (length: number, v: number, omit?: string[]) => p.run({ x: hostTensor('f32', [1, 1, 2], [v, v]) }, { caches: { streams, rows: [{ id: a, length, append: [0, 1] }] }, ...(omit === undefined ? {} : { omit }) });
    const r1 = await step(0, 1, ['new']);
    expect(Object.keys(r1)).toEqual(['all']);
    // The omitted output was appended all the same.
    const r2 = await step(1, 2, ['new']);
    expect(Array.from(r2['all']!.data)).toEqual([2, 2, 4, 4]);
    const r3 = await step(2, 3);
    expect(Object.keys(r3).sort()).toEqual(['all', 'new']);
    expect(Array.from(r3['new']!.data)).toEqual([6, 6]);
    await expect(step(3, 0, ['nope'])).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE, message: expect.stringContaining("omit names 'nope'") });
    await expect(p.run({ x: hostTensor('f32', [1, 1, 2], [0, 0]) }, { caches: { streams, rows: [{ id: a, length: 3, append: [0, 1] }] }, omit: ['all'], argmax: ['all'] })).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE, message: expect.stringContaining('both omit and argmax') });
    // The caller says 5 positions, the worker holds 3, and the row has no restore.
    const err: unknown = await step(5, 0).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CacheLostError);
    expect(err).toMatchObject({ code: RuntimeCode.CACHE_LOST, ids: [a], message: expect.stringContaining(`${String(a)} (holds 3 positions)`) });
    // Nothing was sent: the cache still holds its 3 positions.
    expect(Array.from((await step(3, 4, ['new']))['all']!.data)).toEqual([2, 2, 4, 4, 6, 6, 8, 8]);
    caches.release([a]);
    p.dispose();
  }, 60_000);
});
