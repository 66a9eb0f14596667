import { type Server, type ServerResponse, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { type StreamGuard, startStreamGuard } from './stream-guard.js';

// The stream guard in front of a stand-in upstream that answers as a replica would, or dies
// mid-answer (its socket destroyed: what HAProxy passes on when the replica is killed).
let upstream: Server | undefined;
let guard: StreamGuard | undefined;
afterEach(async () => {
  await guard?.close();
  await new Promise<void>((r) => {
    if (upstream === undefined) r();
    else upstream.close(() => { r(); });
  });
  upstream = guard = undefined;
});

async function serve(handler: (path: string, res: ServerResponse) => void): Promise<string> {
  upstream = createServer((req, res) => {
    req.resume();
    req.on('end', () => { handler(req.url ?? '', res); });
  });
  await new Promise<void>((r) => upstream!.listen(0, '127.0.0.1', r));
  guard = await startStreamGuard({ host: '127.0.0.1', port: 0 }, { host: '127.0.0.1', port: (upstream.address() as AddressInfo).port });
  return `http://127.0.0.1:${String(guard.address.port)}`;
}

const sseHead = { 'content-type': 'text/event-stream', 'x-stageml-replica': 'replica-7' };

describe('stream guard', () => {
  it('passes a complete SSE answer through unchanged, status and headers included', async () => {
    const base = await serve((_p, res) => {
      res.writeHead(200, sseHead);
      res.write('data: {"choices":[{"text":"a"}]}\n\n');
      res.end('data: [DONE]\n\n');
    });
    const r = await fetch(`${base}/v1/completions`, { method: 'POST', body: '{"stream":true}' });
    expect(r.status).toBe(200);
    expect(r.headers.get('x-stageml-replica')).toBe('replica-7');
    expect(await r.text()).toBe('data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n');
    expect(guard!.lostStreams()).toBe(0);
  });

  it('ends an SSE answer cut off mid-stream with a CLI_REPLICA_LOST error event and [DONE]', async () => {
    const base = await serve((_p, res) => {
      res.writeHead(200, sseHead);
      res.write('data: {"choices":[{"text":"a"}]}\n\n');
      setTimeout(() => { res.socket?.destroy(); }, 20);
    });
    const r = await fetch(`${base}/v1/completions`, { method: 'POST', body: '{"stream":true}' });
    const events = (await r.text()).split('\n\n').filter((e) => e !== '');
    expect(events[0]).toBe('data: {"choices":[{"text":"a"}]}');
    expect(events.at(-1)).toBe('data: [DONE]');
    const error = (JSON.parse(events.at(-2)!.slice(6)) as { error: { code: string; type: string; message: string } }).error;
    expect(error.code).toBe('CLI_REPLICA_LOST');
    expect(error.type).toBe('server_error');
    expect(error.message).toContain('replica-7');
    expect(guard!.lostStreams()).toBe(1);
  });

  it('adds nothing to a stream cut after its [DONE]', async () => {
    const base = await serve((_p, res) => {
      res.writeHead(200, sseHead);
      res.write('data: [DONE]\n\n');
      setTimeout(() => { res.socket?.destroy(); }, 20);
    });
    const r = await fetch(`${base}/x`, { method: 'POST', body: '{}' });
    await expect(r.text()).rejects.toThrow();
    expect(guard!.lostStreams()).toBe(0);
  });

  it('cuts a plain answer that was cut (the client sees an error, not a short body), and answers 502 when nothing answers', async () => {
    const base = await serve((_p, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
      res.write('{"partial":');
      setTimeout(() => { res.socket?.destroy(); }, 20);
    });
    const r = await fetch(`${base}/v1/completions`, { method: 'POST', body: '{}' });
    await expect(r.text()).rejects.toThrow();
    const port = (upstream!.address() as AddressInfo).port;
    await new Promise<void>((resolve) => upstream!.close(() => { resolve(); }));
    upstream = undefined;
    await guard!.close();
    guard = await startStreamGuard({ host: '127.0.0.1', port: 0 }, { host: '127.0.0.1', port });
    const gone = await fetch(`http://127.0.0.1:${String(guard.address.port)}/health`);
    expect(gone.status).toBe(502);
    expect(((await gone.json()) as { error: { code: string } }).error.code).toBe('CLI_REPLICA_LOST');
  });
});
