import { StageError, errorMessage } from '@stageml/ir';
import type { Engine, RowSample, Sequence, StepPart, StepRecord, StepResult } from '@stageml/engine';
import { type PickPlan, type SamplingOptions, type TokenPicker, makePicker, pickPlan } from '@stageml/models';
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
  /** Prompt tokens whose keys and values the engine's prefix cache served (`Sequence.cachedTokens`; 0 without prefix caching). */
  readonly cachedTokens: number;
  /** Path the request's tokens took: its adapter's compiled (staged) plan, or the fallback path. */
  readonly path: 'staged' | 'fallback';
  /** Milliseconds from submission to the first token, and to the end. */
  readonly timeToFirstTokenMs: number;
  readonly latencyMs: number;
}

/** Options of a `Scheduler`. */
export interface SchedulerOptions {
  /**
   * Most sequences running together (vLLM's `--max-num-seqs`; default the engine's executor's
   * `scheduling.maxBatch`: 256 on a CUDA GPU, 32 on the host CPU).
   */
  readonly maxBatch?: number;
  /**
   * Most requests one tenant may have waiting for a slot (default 256); beyond it `submit` throws
   * `ROUTER_QUEUE_FULL` for that tenant only. Each tenant's queue is bounded on its own, so a
   * tenant at its bound never causes 429s for another.
   */
  readonly maxQueue?: number;
  /** Most running requests per tenant (fairness cap), by tenant name. */
  readonly tenantCap?: (tenant: string) => number | undefined;
  /** A tenant's own queue bound, overriding `maxQueue` (by tenant name). */
  readonly tenantQueue?: (tenant: string) => number | undefined;
  /** A tenant's weight in the fair sharing of batch slots (default 1; by tenant name). */
  readonly tenantWeight?: (tenant: string) => number | undefined;
  /** Whether an adapter has a compiled plan (staged path); others take the fallback path. Default: all staged. */
  readonly isStaged?: (adapter: string) => boolean;
  /**
   * Most prompt tokens one step prefills, over all prefilling sequences together (rows × the
   * longest chunk, padding included; vLLM's `--max-num-batched-tokens`). Default: the engine's
   * executor's `scheduling.tokenBudget` — 8192 on a CUDA GPU, 64 on the host CPU (two of the
   * engine's default 32-token chunks). Arrivals are prefilled together up to this budget — at
   * least one chunk per step, so a long prompt still advances one chunk per step beside the
   * running streams. A budget of at least `idlePrefillTokens` lets each prompt's chunk grow to
   * `idlePrefillTokens` while streams decode too (otherwise the engine's `prefillChunk`).
   */
  readonly prefillTokens?: number;
  /**
   * A prompt's chunk while no sequence decodes (default the larger of 512 and `prefillTokens`): with no stream to stall, an arriving
   * prompt is prefilled in runs of up to this many tokens rather than `prefillChunk`-sized ones
   * (other arriving prompts join its run only within `prefillTokens`).
   */
  readonly idlePrefillTokens?: number;
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

/** `Scheduler.stepStats`: what the step loop has handed the engine. */
export interface SchedulerStepStats {
  /** Steps (`Engine.step` calls). */
  readonly steps: number;
  /** Steps run as one program run over decode rows and prefill chunks together. */
  readonly mergedSteps: number;
  /** Program runs of those steps (`StepResult.runs`). */
  readonly engineRuns: number;
  /**
   * Milliseconds the step loop spent, summed over its steps: choosing and building each step
   * (`schedule`: admission, pruning, the step record), inside `Engine.step` (`engine`: the
   * engine's input building, the executor's round trip, readback — and, overlapped with it, the
   * previous step's `onToken` calls: the server's detokenizing and SSE writes), taking the step's
   * tokens (`emit`: pickers, stop and length checks), and
   * in the event loop between steps (`yield`: I/O callbacks such as arriving requests and socket
   * writes completing).
   */
  readonly hostMs: { readonly schedule: number; readonly engine: number; readonly emit: number; readonly yield: number };
}

/** Counts for metrics: running and waiting requests per adapter (`''` = base). */
export interface SchedulerSnapshot {
  readonly running: number;
  readonly waiting: number;
  readonly runningByAdapter: Readonly<Record<string, number>>;
  readonly waitingByAdapter: Readonly<Record<string, number>>;
  /** Running and waiting requests per tenant. */
  readonly runningByTenant: Readonly<Record<string, number>>;
  readonly waitingByTenant: Readonly<Record<string, number>>;
  readonly draining: boolean;
}

/** A greedy row of a sampled decode step (`Engine.decodeSample`): temperature 0 is the argmax. */
const GREEDY_ROW: RowSample = { temperature: 0, topK: 0, topP: 1, u: 0 };

/**
 * The row spec of a plan's next pick, when `picks` (the run picks this row's token): a sampled
 * row draws from its stream, a processed one carries its processing; otherwise a greedy
 * placeholder the run does not use, and nothing drawn.
 */
function rowOf(p: PickPlan, picks: boolean): RowSample {
  if (!picks) return GREEDY_ROW;
  const processing = p.processing?.();
  const base = p.kind === 'greedy' ? GREEDY_ROW : { temperature: p.temperature, topK: p.topK, topP: p.topP, u: p.draw() };
  return processing === undefined ? base : { ...base, processing };
}

/**
 * Continuous batching over an `Engine`. Requests wait in per-tenant queues, each bounded on its
 * own (admission control: one tenant's flood fills only its own queue), and are admitted by
 * weighted fair sharing — the free slot goes to the waiting tenant with the fewest running
 * requests per unit of weight, under per-tenant caps — into a running set of at most `maxBatch`
 * sequences. Between decode steps new sequences are prefilled and join, finished ones leave. A
 * step is one engine call (`Engine.step`, a step record): the decode rows of every running,
 * prefilled sequence (whatever their adapters: adapters are slot data, so composition never
 * compiles anything) and the next chunks of admitted sequences, together at most
 * `prefillTokens` prompt tokens (chunked prefill: a long prompt never stalls running streams for
 * more than one chunk; a burst of arrivals is prefilled together); the engine runs both as one
 * program run where the padding allows. Each sequence's KV stays resident in the engine and is
 * appended in place; a cancelled or finished sequence frees its KV and slot after the step it is
 * in.
 */
export class Scheduler {
  readonly #engine: Engine;
  readonly #maxBatch: number;
  readonly #maxQueue: number;
  readonly #tenantCap: (tenant: string) => number | undefined;
  readonly #tenantQueue: (tenant: string) => number | undefined;
  readonly #tenantWeight: (tenant: string) => number | undefined;
  readonly #runningOf = new Map<string, number>();
  /** When each tenant last got a slot (admission serial), for round-robin tie-breaking. */
  readonly #lastServed = new Map<string, number>();
  #serial = 0;
  readonly #isStaged: (adapter: string) => boolean;
  readonly #prefillTokens: number;
  readonly #idlePrefillTokens: number;
  readonly #queues = new Map<string, Seq[]>();
  readonly #running: Seq[] = [];
  #waiting = 0;
  #pumping = false;
  #steps = 0;
  #mergedSteps = 0;
  #engineRuns = 0;
  readonly #hostMs = { schedule: 0, engine: 0, emit: 0, yield: 0 };
  /** Deferred `onToken` calls and resolutions (`#accept`), run by `#flush`. */
  readonly #emissions: (() => void)[] = [];
  /** When the last `Engine.step` call settled (`hostMs.emit` runs from here). */
  #engineAt = 0;
  /** When the step loop's current iteration began (`hostMs.schedule` runs from here to `Engine.step`). */
  #loopAt = 0;
  #draining = false;
  #idle: (() => void)[] = [];

  /** A scheduler running `engine`. */
  constructor(engine: Engine, opts: SchedulerOptions = {}) {
    this.#engine = engine;
    // Defaults from the executor the engine drives (`Engine.scheduling`): thousands of tokens per
    // step on a GPU, 64 on the host CPU.
    const hints = engine.scheduling;
    this.#maxBatch = opts.maxBatch ?? hints.maxBatch;
    if (!Number.isSafeInteger(this.#maxBatch) || this.#maxBatch < 1) throw new RouterError(RouterCode.BAD_CONFIG, `maxBatch must be a positive integer, got ${String(opts.maxBatch)}`);
    this.#maxQueue = opts.maxQueue ?? 256;
    this.#tenantCap = opts.tenantCap ?? (() => undefined);
    this.#tenantQueue = opts.tenantQueue ?? (() => undefined);
    this.#tenantWeight = opts.tenantWeight ?? (() => undefined);
    this.#isStaged = opts.isStaged ?? (() => true);
    const budget = opts.prefillTokens ?? hints.tokenBudget;
    if (!Number.isSafeInteger(budget) || budget < 1) throw new RouterError(RouterCode.BAD_CONFIG, `prefillTokens must be a positive integer, got ${String(opts.prefillTokens)}`);
    this.#prefillTokens = budget;
    const idle = opts.idlePrefillTokens ?? Math.max(512, budget);
    if (!Number.isSafeInteger(idle) || idle < 1) throw new RouterError(RouterCode.BAD_CONFIG, `idlePrefillTokens must be a positive integer, got ${String(opts.idlePrefillTokens)}`);
    this.#idlePrefillTokens = idle;
  }

  /** Running and waiting counts for metrics and readiness. */
  snapshot(): SchedulerSnapshot {
    const runningByAdapter: Record<string, number> = {};
    const waitingByAdapter: Record<string, number> = {};
    const runningByTenant: Record<string, number> = {};
    const waitingByTenant: Record<string, number> = {};
    let running = 0;
    for (const s of this.#running) {
      // Finished or cancelled: leaves the running set after the step it is in.
      if (s.done) continue;
      running++;
      runningByAdapter[s.req.adapter ?? ''] = (runningByAdapter[s.req.adapter ?? ''] ?? 0) + 1;
      runningByTenant[s.req.tenant] = (runningByTenant[s.req.tenant] ?? 0) + 1;
    }
    for (const [t, q] of this.#queues) {
      if (q.length > 0) waitingByTenant[t] = q.length;
      for (const s of q) waitingByAdapter[s.req.adapter ?? ''] = (waitingByAdapter[s.req.adapter ?? ''] ?? 0) + 1;
    }
    return { running, waiting: this.#waiting, runningByAdapter, waitingByAdapter, runningByTenant, waitingByTenant, draining: this.#draining };
  }

  /**
   * Steps taken (one `Engine.step` call each), those whose decode rows and prefill chunks ran as
   * one program run, and the program runs they took.
   */
  stepStats(): SchedulerStepStats {
    return { steps: this.#steps, mergedSteps: this.#mergedSteps, engineRuns: this.#engineRuns, hostMs: { ...this.#hostMs } };
  }

  /** The queue bound of `tenant`. */
  #queueBound(tenant: string): number {
    return this.#tenantQueue(tenant) ?? this.#maxQueue;
  }

  /**
   * Whether `tenant`'s queue is full, so that `submit` would throw `ROUTER_QUEUE_FULL`. O(1): the
   * server calls it before reading a request's body (the cheap 429 path).
   */
  isFull(tenant: string): boolean {
    return (this.#queues.get(tenant)?.length ?? 0) >= this.#queueBound(tenant);
  }

  /**
   * Whether `tenant`'s queue has room for `count` more requests at once: the sequences of one API
   * request (`n` × prompts) are admitted all together or not at all, so a refused request never
   * leaves some of its sequences running.
   */
  hasRoom(tenant: string, count: number): boolean {
    return (this.#queues.get(tenant)?.length ?? 0) + count <= this.#queueBound(tenant);
  }

  /**
   * Seconds a client of `tenant` should wait before retrying when its queue is full: the time for
   * its waiting requests to get slots at its current share, at least 1 (a rough estimate).
   */
  retryAfterSeconds(tenant?: string): number {
    const waiting = tenant === undefined ? this.#waiting : (this.#queues.get(tenant)?.length ?? 0);
    const slots = tenant === undefined ? this.#maxBatch : Math.max(1, this.#runningOf.get(tenant) ?? 0, Math.min(this.#maxBatch, this.#tenantCap(tenant) ?? this.#maxBatch));
    return Math.min(60, Math.max(1, Math.ceil(waiting / Math.max(1, slots))));
  }

  /**
   * Queues a request. Throws `ROUTER_DRAINING` while draining and `ROUTER_QUEUE_FULL` when the
   * queue is full (nothing is queued then); otherwise resolves when the request finishes.
   */
  submit(req: GenerationRequest): Promise<GenerationResult> {
    if (this.#draining) throw new RouterError(RouterCode.DRAINING, 'the server is shutting down and accepts no new requests');
    if (this.isFull(req.tenant)) throw new RouterError(RouterCode.QUEUE_FULL, `this tenant's queue is full (${String(this.#queueBound(req.tenant))} waiting)`);
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

  /**
   * Fills free batch slots by weighted fair sharing: each slot goes to the tenant, among those
   * waiting and below their cap, with the fewest running requests per unit of weight (ties: the
   * tenant served least recently: round-robin). A tenant below its share therefore always gets the next slot.
   */
  #admit(): Seq[] {
    const admitted: Seq[] = [];
    const active = this.#runningOf;
    active.clear();
    for (const s of this.#running) if (!s.done) active.set(s.req.tenant, (active.get(s.req.tenant) ?? 0) + 1);
    while (this.#running.length + admitted.length < this.#maxBatch && this.#waiting > 0) {
      let best: string | undefined;
      let bestLoad = Infinity;
      let bestServed = Infinity;
      for (const [tenant, q] of this.#queues) {
        if (q.length === 0) continue;
        const n = active.get(tenant) ?? 0;
        const cap = this.#tenantCap(tenant);
        if (cap !== undefined && n >= cap) continue;
        const load = n / Math.max(1e-9, this.#tenantWeight(tenant) ?? 1);
        const served = this.#lastServed.get(tenant) ?? -1;
        if (load < bestLoad || (load === bestLoad && served < bestServed)) [best, bestLoad, bestServed] = [tenant, load, served];
      }
      if (best === undefined) break;
      admitted.push(this.#queues.get(best)!.shift()!);
      active.set(best, (active.get(best) ?? 0) + 1);
      this.#lastServed.set(best, this.#serial++);
      this.#waiting--;
    }
    for (const [t, q] of this.#queues) if (q.length === 0) this.#queues.delete(t);
    if (this.#lastServed.size > 4 * (this.#queues.size + 64)) for (const t of this.#lastServed.keys()) if (!this.#queues.has(t)) this.#lastServed.delete(t);
    return admitted;
  }

  #emit(seq: Seq, logits: ArrayLike<number>): void {
    if (seq.done) return;
    this.#accept(seq, seq.picker(logits));
  }

  /** Tokens picked where the logits are (undefined: a prompt not finished): each into its picker's state and its sequence. */
  #acceptPicks(group: readonly Seq[], plans: readonly (PickPlan | undefined)[], ids: readonly (number | undefined)[]): void {
    group.forEach((s, i) => {
      const id = ids[i];
      if (id === undefined || s.done) return;
      plans[i]!.accept?.(id);
      this.#accept(s, id);
    });
  }

  /** Takes `id` as the sequence's next token: streams it, and finishes the sequence at a stop or its length. */
  #accept(seq: Seq, id: number): void {
    if (seq.done) return;
    seq.last = id;
    seq.newIds.push(id);
    seq.firstTokenAt ??= performance.now();
    // The request hears of its token (the server detokenizes and writes SSE) once the next step
    // is on its way to the executor: `#flush`.
    const onToken = seq.req.onToken;
    if (onToken !== undefined) this.#emissions.push(() => {
      onToken(id);
    });
    // A constrained request whose text is complete (nothing may follow) ends as a stop.
    const complete = seq.req.sampling.constraint?.finished === true;
    const finish = seq.stop.has(id) || complete ? 'stop' : seq.newIds.length >= seq.req.maxNewTokens ? 'length' : undefined;
    if (finish === undefined) return;
    seq.done = true;
    const result: GenerationResult = {
      newIds: seq.newIds,
      finishReason: finish,
      promptTokens: seq.req.prompt.length,
      cachedTokens: seq.es?.cachedTokens ?? 0,
      path: seq.path,
      timeToFirstTokenMs: seq.firstTokenAt - seq.submitted,
      latencyMs: performance.now() - seq.submitted,
    };
    // After its last token's `onToken`, as before the emissions were deferred.
    this.#emissions.push(() => {
      seq.resolve(result);
    });
  }

  /** Runs the deferred `onToken` calls and resolutions of the steps taken so far, in order. */
  #flush(): void {
    const pending = this.#emissions.splice(0);
    for (const f of pending) f();
  }

  #fail(seqs: readonly Seq[], e: unknown): void {
    for (const s of seqs) {
      if (s.done) continue;
      s.done = true;
      s.reject(e instanceof StageError ? e : new RouterError(RouterCode.BAD_REQUEST, errorMessage(e), { cause: e }));
    }
  }

  /** Opens the engine sequence of a newly admitted request; a bad prompt fails only it. */
  #open(seq: Seq): void {
    try {
      const pad = seq.req.padTokenId;
      seq.es = this.#engine.open(seq.req.adapter, seq.req.prompt, seq.req.prompt.map((t) => (pad !== undefined && t === pad ? 0 : 1)));
      // Where its cache will grow to: an executor with a persistent batch sizes it once.
      seq.es.reserve = seq.req.prompt.length + seq.req.maxNewTokens;
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

  /**
   * The sequences to prefill this step: in arrival order, while rows × longest chunk fits
   * `prefillTokens` (at least one). With nothing decoding (`idle`) a chunk may grow to
   * `idlePrefillTokens`, and the first prompt's chunk raises the budget to its own size.
   */
  #prefillGroup(idle: boolean): { readonly group: Seq[]; readonly maxChunk: number | undefined } {
    const group: Seq[] = [];
    // A step budget of at least the idle chunk (a GPU's thousands of tokens) lets a prompt take
    // one chunk of up to that size beside running streams too, as vLLM's chunked prefill does.
    const maxChunk = idle || this.#prefillTokens >= this.#idlePrefillTokens ? this.#idlePrefillTokens : undefined;
    let budget = this.#prefillTokens;
    let longest = 0;
    for (const s of this.#running) {
      if (s.es?.slot === undefined || s.es.ready || s.done) continue;
      const c = Math.max(longest, this.#engine.chunkOf(s.es, maxChunk));
      // Idle, the first prompt may take one run of up to idlePrefillTokens; more rows join only
      // within the usual budget (a burst of short prompts is not one huge run).
      if (group.length === 0) budget = Math.max(budget, c);
      else if ((group.length + 1) * c > budget) break;
      group.push(s);
      longest = c;
    }
    return { group, maxChunk };
  }

  /**
   * One step: the decode rows and the prefill chunks handed to the engine as one step record
   * (`Engine.step`), which runs them as one program run where it can. Tokens are picked where the
   * logits are (`rows`: an argmax when every row is plainly greedy; each sampled row with its
   * stream's next draw, each processed one with its picker's state; a prefill row draws only when
   * this step finishes its prompt, as its picker would have) unless a row of the part reports
   * log-probabilities, which needs the logits on the host for the whole part. A failed part fails
   * its own requests.
   */
  async #step(decoding: readonly Seq[], prefilling: readonly Seq[], maxChunk: number | undefined): Promise<void> {
    const dPlans = decoding.map((s) => pickPlan(s.picker));
    const pPlans = prefilling.map((s) => pickPlan(s.picker));
    const dPicks = dPlans.every((p) => p !== undefined);
    const pPicks = pPlans.every((p) => p !== undefined);
    const record: StepRecord = {
      ...(decoding.length === 0 ? {} : { decode: { seqs: decoding.map((s) => s.es!), tokens: decoding.map((s) => s.last), ...(dPicks ? { rows: dPlans.map((p) => rowOf(p, true)) } : {}) } }),
      ...(prefilling.length === 0
        ? {}
        : { prefill: { seqs: prefilling.map((s) => s.es!), ...(pPicks ? { rows: pPlans.map((p, i) => rowOf(p, this.#engine.finishesPrefill(prefilling[i]!.es!, maxChunk))) } : {}), ...(maxChunk === undefined ? {} : { maxChunk }) } }),
    };
    let result: StepResult;
    const sent = performance.now();
    this.#hostMs.schedule += sent - this.#loopAt;
    try {
      // Overlap: the last step's tokens reach their requests (detokenizing, SSE writes) while
      // this step runs on the executor. The turn of the event loop first lets the engine send
      // the step (its request is written in the microtasks `step` starts with).
      const running = this.#engine.step(record).then((r) => ({ r }), (e: unknown) => ({ e }));
      if (this.#emissions.length > 0) {
        await new Promise<void>((resolve) => setImmediate(resolve));
        this.#flush();
      }
      const settled = await running;
      if ('e' in settled) throw settled.e;
      result = settled.r;
    } catch (e) {
      this.#fail([...decoding, ...prefilling], e);
      return;
    } finally {
      this.#engineAt = performance.now();
      this.#hostMs.engine += this.#engineAt - sent;
    }
    this.#steps++;
    if (result.merged) this.#mergedSteps++;
    this.#engineRuns += result.runs;
    const rows = (r: StepRecord): { readonly d?: readonly RowSample[]; readonly p?: readonly RowSample[] } => ({ ...(r.decode?.rows === undefined ? {} : { d: r.decode.rows }), ...(r.prefill?.rows === undefined ? {} : { p: r.prefill.rows }) });
    const specs = rows(record);
    const accept = (group: readonly Seq[], plans: readonly (PickPlan | undefined)[], picks: boolean, values: readonly (number | Float32Array | undefined)[]): void => {
      if (picks) this.#acceptPicks(group, plans, values as readonly (number | undefined)[]);
      else
        group.forEach((s, i) => {
          const logits = values[i];
          if (logits !== undefined) this.#emit(s, logits as Float32Array);
        });
    };
    // A part the engine refused for its row specs (`ENGINE_BAD_OPTIONS`, before anything ran) runs
    // each row alone with the same specs: one request's bad values fail only that request.
    const retries: (() => Promise<void>)[] = [];
    const take = (group: readonly Seq[], plans: readonly (PickPlan | undefined)[], picks: boolean, part: StepPart<number | Float32Array | undefined> | undefined, alone: (i: number) => StepRecord): void => {
      if (part === undefined || group.length === 0) return;
      if (part.values !== undefined) {
        accept(group, plans, picks, part.values);
        return;
      }
      if (group.length === 1 || !(part.error instanceof StageError && part.error.code === 'ENGINE_BAD_OPTIONS')) {
        this.#fail(group, part.error);
        return;
      }
      retries.push(async () => {
        for (const [i, s] of group.entries()) {
          if (s.done) continue;
          try {
            const r = await this.#engine.step(alone(i));
            this.#steps++;
            this.#engineRuns += r.runs;
            const one = r.decode ?? r.prefill;
            if (one?.values === undefined) this.#fail([s], one?.error);
            else accept([s], [plans[i]], picks, one.values);
          } catch (e) {
            this.#fail([s], e);
          }
        }
      });
    };
    take(decoding, dPlans, dPicks, result.decode, (i) => ({ decode: { seqs: [decoding[i]!.es!], tokens: [decoding[i]!.last], ...(specs.d === undefined ? {} : { rows: [specs.d[i]!] }) } }));
    take(prefilling, pPlans, pPicks, result.prefill, (i) => ({ prefill: { seqs: [prefilling[i]!.es!], ...(specs.p === undefined ? {} : { rows: [specs.p[i]!] }), ...(maxChunk === undefined ? {} : { maxChunk }) } }));
    for (const retry of retries) await retry();
  }

  async #pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      for (;;) {
        this.#loopAt = performance.now();
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
        const { group: prefilling, maxChunk } = this.#prefillGroup(decoding.length === 0);
        if (decoding.length === 0 && prefilling.length === 0) {
          // Only sequences waiting for a slot load (or a free slot): their attach resumes the loop.
          if (this.#running.some((s) => s.attaching)) break;
          await new Promise<void>((resolve) => setTimeout(resolve, 1));
          continue;
        }
        await this.#step(decoding, prefilling.filter((s) => !s.done), maxChunk);
        const taken = performance.now();
        this.#hostMs.emit += taken - this.#engineAt;
        this.#prune();
        const pruned = performance.now();
        this.#hostMs.schedule += pruned - taken;
        // NOTE: executors may compute synchronously; yield to the event loop between steps so new
        // requests (and cancellations) arrive and join at the next step.
        await new Promise<void>((resolve) => setImmediate(resolve));
        this.#hostMs.yield += performance.now() - pruned;
      }
    } finally {
      this.#flush();
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
