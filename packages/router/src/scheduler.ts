import { StageError } from '@stageml/ir';
import type { Engine, Sequence } from '@stageml/engine';
import { type SamplingOptions, type TokenPicker, makePicker } from '@stageml/models';
import { RouterCode, RouterError } from './errors.js';

/** One generation request, as the router schedules it. */
export interface GenerationRequest {
  /** Tenant the request counts against (fairness, caps). */
  readonly tenant: string;
  /** Adapter, or undefined for the base model. */
  readonly adapter: string | undefined;
  /** Prompt token ids (non-empty). */
  readonly prompt: readonly number[];
  /** Most new tokens. */
  readonly maxNewTokens: number;
  /** Greedy or sampling. */
  readonly sampling: SamplingOptions;
  /** Tokens that end generation (kept in the output). */
  readonly stopTokens: readonly number[];
  /** Prompt tokens equal to this id are masked (HF `pad_token_id` semantics). */
  readonly padTokenId?: number | undefined;
  /** Called with each new token as it is chosen. */
  readonly onToken?: (id: number) => void;
  /** Cancels the request (client gone). */
  readonly signal?: AbortSignal | undefined;
}

/** What a finished request produced. */
export interface GenerationResult {
  readonly newIds: number[];
  readonly finishReason: 'stop' | 'length';
  readonly promptTokens: number;
  /** Path the request's tokens took: its adapter's compiled (staged) plan, or the fallback path. */
  readonly path: 'staged' | 'fallback';
  /** Milliseconds from submission to the first token, and to the end. */
  readonly timeToFirstTokenMs: number;
  readonly latencyMs: number;
}

/** Options of a `Scheduler`. */
export interface SchedulerOptions {
  /** Most sequences decoded together (default 32). */
  readonly maxBatch?: number;
  /** Most requests waiting for a slot (default 256); beyond it `submit` throws `ROUTER_QUEUE_FULL`. */
  readonly maxQueue?: number;
  /** Most running requests per tenant (fairness cap), by tenant name. */
  readonly tenantCap?: (tenant: string) => number | undefined;
  /** Whether an adapter has a compiled plan (staged path); others take the fallback path. Default: all staged. */
  readonly isStaged?: (adapter: string) => boolean;
}

interface Seq {
  readonly req: GenerationRequest;
  readonly path: 'staged' | 'fallback';
  readonly picker: TokenPicker;
  readonly stop: ReadonlySet<number>;
  readonly submitted: number;
  readonly resolve: (r: GenerationResult) => void;
  readonly reject: (e: unknown) => void;
  /** The engine's sequence (resident KV, slot), once admitted. */
  es: Sequence | undefined;
  /** Whether an attach (slot acquisition) is in flight. */
  attaching: boolean;
  last: number;
  newIds: number[];
  firstTokenAt: number | undefined;
  done: boolean;
}

/** Counts for metrics: running and waiting requests per adapter (`''` = base). */
export interface SchedulerSnapshot {
  readonly running: number;
  readonly waiting: number;
  readonly runningByAdapter: Readonly<Record<string, number>>;
  readonly waitingByAdapter: Readonly<Record<string, number>>;
  readonly draining: boolean;
}

/**
 * Continuous batching over an `Engine`. Requests wait in per-tenant queues (bounded in total:
 * admission control) and are admitted round-robin across tenants, under per-tenant caps, into a
 * running set of at most `maxBatch` sequences. Between decode steps new sequences are prefilled and
 * join, finished ones leave. A step is one decode run over every running, prefilled sequence
 * (whatever their adapters: adapters are slot data, so composition never compiles anything) plus at
 * most one prefill chunk of one admitted sequence (chunked prefill: a long prompt never stalls
 * running streams for more than one chunk). Each sequence's KV stays resident in the engine and is
 * appended in place; a cancelled or finished sequence frees its KV and slot after the step it is in.
 */
export class Scheduler {
  readonly #engine: Engine;
  readonly #maxBatch: number;
  readonly #maxQueue: number;
  readonly #tenantCap: (tenant: string) => number | undefined;
  readonly #isStaged: (adapter: string) => boolean;
  readonly #queues = new Map<string, Seq[]>();
  readonly #running: Seq[] = [];
  #waiting = 0;
  #rr = 0;
  #pumping = false;
  #draining = false;
  #idle: (() => void)[] = [];

  /** A scheduler running `engine`. */
  constructor(engine: Engine, opts: SchedulerOptions = {}) {
    this.#engine = engine;
    this.#maxBatch = opts.maxBatch ?? 32;
    this.#maxQueue = opts.maxQueue ?? 256;
    this.#tenantCap = opts.tenantCap ?? (() => undefined);
    this.#isStaged = opts.isStaged ?? (() => true);
  }

  /** Running and waiting counts for metrics and readiness. */
  snapshot(): SchedulerSnapshot {
    const runningByAdapter: Record<string, number> = {};
    const waitingByAdapter: Record<string, number> = {};
    for (const s of this.#running) runningByAdapter[s.req.adapter ?? ''] = (runningByAdapter[s.req.adapter ?? ''] ?? 0) + 1;
    for (const q of this.#queues.values()) for (const s of q) waitingByAdapter[s.req.adapter ?? ''] = (waitingByAdapter[s.req.adapter ?? ''] ?? 0) + 1;
    return { running: this.#running.length, waiting: this.#waiting, runningByAdapter, waitingByAdapter, draining: this.#draining };
  }

  /** Seconds a client should wait before retrying when the queue is full (a rough estimate). */
  retryAfterSeconds(): number {
    return Math.max(1, Math.ceil(this.#waiting / Math.max(1, this.#maxBatch)));
  }

  /**
   * Queues a request. Throws `ROUTER_DRAINING` while draining and `ROUTER_QUEUE_FULL` when the
   * queue is full (nothing is queued then); otherwise resolves when the request finishes.
   */
  submit(req: GenerationRequest): Promise<GenerationResult> {
    if (this.#draining) throw new RouterError(RouterCode.DRAINING, 'the server is shutting down and accepts no new requests');
    if (this.#waiting >= this.#maxQueue) throw new RouterError(RouterCode.QUEUE_FULL, `the queue is full (${String(this.#maxQueue)} waiting)`);
    if (req.prompt.length === 0) throw new RouterError(RouterCode.BAD_REQUEST, 'the prompt is empty');
    const picker = makePicker(req.sampling);
    return new Promise<GenerationResult>((resolve, reject) => {
      const seq: Seq = {
        req,
        path: req.adapter === undefined || this.#isStaged(req.adapter) ? 'staged' : 'fallback',
        picker,
        stop: new Set(req.stopTokens),
        submitted: performance.now(),
        resolve,
        reject,
        es: undefined,
        attaching: false,
        last: -1,
        newIds: [],
        firstTokenAt: undefined,
        done: false,
      };
      const q = this.#queues.get(req.tenant) ?? [];
      q.push(seq);
      this.#queues.set(req.tenant, q);
      this.#waiting++;
      req.signal?.addEventListener('abort', () => {
        this.#cancel(seq);
      }, { once: true });
      void this.#pump();
    });
  }

  /** Stops accepting requests and resolves once every queued and running request has finished. */
  drain(): Promise<void> {
    this.#draining = true;
    if (this.#running.length === 0 && this.#waiting === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idle.push(resolve));
  }

  #cancel(seq: Seq): void {
    if (seq.done) return;
    seq.done = true;
    const q = this.#queues.get(seq.req.tenant);
    const i = q?.indexOf(seq) ?? -1;
    if (i >= 0) {
      q!.splice(i, 1);
      this.#waiting--;
    }
    seq.reject(new RouterError(RouterCode.CANCELLED, 'the request was cancelled'));
  }

  #admit(): Seq[] {
    const admitted: Seq[] = [];
    const tenants = [...this.#queues.keys()];
    let blocked = 0;
    while (this.#running.length + admitted.length < this.#maxBatch && this.#waiting > 0 && blocked < tenants.length) {
      const tenant = tenants[this.#rr++ % tenants.length]!;
      const q = this.#queues.get(tenant)!;
      const cap = this.#tenantCap(tenant);
      const active = this.#running.filter((s) => s.req.tenant === tenant).length + admitted.filter((s) => s.req.tenant === tenant).length;
      if (q.length === 0 || (cap !== undefined && active >= cap)) {
        blocked++;
        continue;
      }
      blocked = 0;
      admitted.push(q.shift()!);
      this.#waiting--;
    }
    for (const [t, q] of this.#queues) if (q.length === 0) this.#queues.delete(t);
    return admitted;
  }

  #emit(seq: Seq, logits: ArrayLike<number>): void {
    if (seq.done) return;
    const id = seq.picker(logits);
    seq.last = id;
    seq.newIds.push(id);
    seq.firstTokenAt ??= performance.now();
    seq.req.onToken?.(id);
    const finish = seq.stop.has(id) ? 'stop' : seq.newIds.length >= seq.req.maxNewTokens ? 'length' : undefined;
    if (finish === undefined) return;
    seq.done = true;
    const now = performance.now();
    seq.resolve({
      newIds: seq.newIds,
      finishReason: finish,
      promptTokens: seq.req.prompt.length,
      path: seq.path,
      timeToFirstTokenMs: seq.firstTokenAt - seq.submitted,
      latencyMs: now - seq.submitted,
    });
  }

  #fail(seqs: readonly Seq[], e: unknown): void {
    for (const s of seqs) {
      if (s.done) continue;
      s.done = true;
      s.reject(e instanceof StageError ? e : new RouterError(RouterCode.BAD_REQUEST, e instanceof Error ? e.message : String(e), { cause: e }));
    }
  }

  /** Opens the engine sequence of a newly admitted request; a bad prompt fails only it. */
  #open(seq: Seq): void {
    try {
      const pad = seq.req.padTokenId;
      seq.es = this.#engine.open(seq.req.adapter, seq.req.prompt, seq.req.prompt.map((t) => (pad !== undefined && t === pad ? 0 : 1)));
    } catch (e) {
      this.#fail([seq], e);
    }
  }

  /** Starts acquiring a slot for `seq` without blocking the step loop; the loop resumes when it settles. */
  #attach(seq: Seq): void {
    if (seq.es === undefined || seq.es.slot !== undefined || seq.attaching) return;
    seq.attaching = true;
    this.#engine.attach(seq.es).then(
      () => {
        seq.attaching = false;
        void this.#pump();
      },
      (e: unknown) => {
        seq.attaching = false;
        this.#fail([seq], e);
        void this.#pump();
      },
    );
  }

  async #prefill(seq: Seq): Promise<void> {
    try {
      const logits = await this.#engine.prefill(seq.es!);
      if (logits !== undefined) this.#emit(seq, logits);
    } catch (e) {
      this.#fail([seq], e);
    }
  }

  async #decode(group: readonly Seq[]): Promise<void> {
    try {
      const logits = await this.#engine.decode(group.map((s) => s.es!), group.map((s) => s.last));
      group.forEach((s, i) => {
        this.#emit(s, logits[i]!);
      });
    } catch (e) {
      this.#fail(group, e);
    }
  }

  async #pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      for (;;) {
        const admitted = this.#admit();
        for (const s of admitted) {
          this.#running.push(s);
          this.#open(s);
        }
        this.#prune();
        for (const s of this.#running) this.#attach(s);
        if (this.#running.length === 0) {
          // Nothing runs: stop unless the last admission took someone (caps can hold the rest).
          if (this.#waiting === 0 || admitted.length === 0) break;
          continue;
        }
        const decoding = this.#running.filter((s) => s.es?.ready === true);
        const prefilling = this.#running.find((s) => s.es?.slot !== undefined && !s.es.ready);
        if (decoding.length === 0 && prefilling === undefined) {
          // Only sequences waiting for a slot load (or a free slot): their attach resumes the loop.
          if (this.#running.some((s) => s.attaching)) break;
          await new Promise<void>((resolve) => setTimeout(resolve, 1));
          continue;
        }
        if (decoding.length > 0) await this.#decode(decoding);
        if (prefilling !== undefined && !prefilling.done) await this.#prefill(prefilling);
        this.#prune();
        // NOTE: executors may compute synchronously; yield to the event loop between steps so new
        // requests (and cancellations) arrive and join at the next step.
        await new Promise<void>((resolve) => setImmediate(resolve));
      }
    } finally {
      this.#pumping = false;
      if (this.#running.length === 0 && this.#waiting === 0) for (const f of this.#idle.splice(0)) f();
    }
  }

  /** Drops finished and cancelled sequences, freeing their KV memory and slot holds. */
  #prune(): void {
    for (let i = this.#running.length - 1; i >= 0; i--) {
      const s = this.#running[i]!;
      if (!s.done) continue;
      if (s.es !== undefined) this.#engine.release(s.es);
      this.#running.splice(i, 1);
    }
  }
}
