import { type IncomingHttpHeaders, type IncomingMessage, type OutgoingHttpHeaders, Agent, type Server, createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { CliCode } from './errors.js';

/** Where the stream guard sends requests: a TCP address or a unix socket (HAProxy's `bind /path`). */
export type GuardUpstream = { readonly host: string; readonly port: number } | { readonly socketPath: string };

/** A running stream guard. */
export interface StreamGuard {
  /** The address it listens on. */
  readonly address: AddressInfo;
  /** Streams it ended with an error event because the upstream went away mid-stream. */
  readonly lostStreams: () => number;
  /** Stops listening and closes every connection. */
  close(): Promise<void>;
}

/** Headers that belong to one connection, not to the message (RFC 9110 §7.6.1). */
const HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer']);

function endToEnd(h: IncomingHttpHeaders): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(h)) if (v !== undefined && !HOP.has(k)) out[k] = v;
  return out;
}

/** The SSE events that end a stream whose replica was lost: an error event in the server's own form, then `[DONE]`. */
export function lostStreamEvents(replica: string | undefined): string {
  const error = {
    message: `the replica${replica === undefined ? '' : ` ${replica}`} serving this stream went away before the answer was complete; the answer is cut off here (retry the request)`,
    type: 'server_error',
    code: CliCode.REPLICA_LOST,
  };
  return `data: ${JSON.stringify({ error })}\n\ndata: [DONE]\n\n`;
}

/**
 * A small HTTP relay in front of HAProxy (`stageml cluster`). HAProxy can only cut a client's
 * response when the replica behind it dies mid-answer, and an SSE client then sees a 200 stream
 * that simply stops: no `[DONE]`, no error. The guard relays each request and response unchanged
 * and watches the stream: when the upstream goes away before a `text/event-stream` answer is
 * complete and before its `[DONE]`, it ends the client's stream itself with an error event
 * (`CLI_REPLICA_LOST`) and `[DONE]`, as the server does for an error mid-stream. A plain answer
 * cut off is cut off for the client too (its connection is reset, not ended as if complete); no
 * answer at all is a 502 with a JSON error.
 */
export async function startStreamGuard(listen: { readonly host: string; readonly port: number }, upstream: GuardUpstream): Promise<StreamGuard> {
  const agent = new Agent({ keepAlive: true, maxSockets: 4096 });
  let lost = 0;
  const server: Server = createServer((req, res) => {
    const up = request({ ...upstream, agent, method: req.method, path: req.url, headers: endToEnd(req.headers) });
    let answer: IncomingMessage | undefined;
    up.on('response', (r) => {
      answer = r;
      const sse = (r.headers['content-type'] ?? '').startsWith('text/event-stream');
      res.writeHead(r.statusCode ?? 502, r.statusMessage, endToEnd(r.headers));
      res.flushHeaders();
      // The last bytes seen, enough to find `data: [DONE]` across chunk boundaries.
      let tail = '';
      let done = false;
      r.on('data', (chunk: Buffer) => {
        if (sse && !done) {
          tail = (tail + chunk.toString('latin1')).slice(-64);
          done = tail.includes('data: [DONE]');
        }
      });
      r.pipe(res, { end: false });
      // A cut connection: 'close' below decides what the client sees.
      r.on('error', () => undefined);
      r.on('close', () => {
        if (r.complete) {
          res.end();
          return;
        }
        if (sse && !done && !res.destroyed) {
          lost++;
          res.end(lostStreamEvents(typeof r.headers['x-stageml-replica'] === 'string' ? r.headers['x-stageml-replica'] : undefined));
        } else res.destroy();
      });
    });
    up.on('error', (e) => {
      if (answer !== undefined) return; // The response's own close handles a cut after the headers.
      if (res.headersSent) {
        res.destroy();
        return;
      }
      const body = JSON.stringify({ error: { message: `no replica answered: ${e.message}`, type: 'server_error', code: CliCode.REPLICA_LOST } });
      res.writeHead(502, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    });
    // A client that leaves early takes its upstream request with it (the replica cancels the work).
    res.on('close', () => {
      if (!res.writableFinished) up.destroy();
    });
    req.pipe(up);
  });
  server.keepAliveTimeout = 75_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(listen.port, listen.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return {
    address: server.address() as AddressInfo,
    lostStreams: () => lost,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => {
          agent.destroy();
          resolve();
        });
        server.closeAllConnections();
      }),
  };
}
