import type { BindingTimes } from '@stageml/annotations';
import { type AttrsOf, type Graph, GraphBuilder, type HostTensor, type OpKey, type TensorType, type Value, type ValueId, numElements, opDef, seededRandom } from '@stageml/ir';
import type { ResolvedContext } from './context.js';
import { evalDimAt } from './cost.js';
import type { ResidualEstimate, RewriteLogEntry } from './driver.js';
import { RewriteError, RwCode } from './errors.js';
import type { CostGuard, RuleContext, ValueDef } from './rule.js';
import { MatchSignatures } from './signature.js';
import { WorkGraph, attrKeyOf, opKey } from './work-graph.js';

/** Effect of a candidate rewrite on the residual. */
export interface Delta {
  /** Change of per-request time (seconds; 0 within rounding). */
  readonly seconds: number;
  /** Change of constant-table bytes. */
  readonly constantBytes: number;
}

/** A rewrite ready to commit. */
export interface Application {
  readonly rule: string;
  readonly root: ValueId;
  readonly replacement: ValueId;
  /** Dead nodes the replacement brings in, operands first. */
  readonly fresh: readonly number[];
  /** Nodes the pattern matched. */
  readonly matched: readonly number[];
  readonly delta: Delta;
}

function add(m: Map<number, number>, k: number, d: number): void {
  m.set(k, (m.get(k) ?? 0) + d);
}

/**
 * State of one driver run: the working graph, value handles for rules, the builder of the rule
 * being applied, the residual's running estimate, and the `RuleContext` rules see.
 */
export class RewriteSession {
  readonly wg: WorkGraph;
  readonly ctx: ResolvedContext;
  readonly ruleContext: RuleContext;
  /** Signatures of matches whose rewrite made requests slower (see `MatchSignatures`). */
  readonly slower: MatchSignatures;
  // The nodes of the match being applied, and whether its rule looked past them.
  #matched: readonly number[] = [];
  #looked = false;
  readonly #handles: Value[] = [];
  readonly #ids = new WeakMap<Value, ValueId>();
  #build: { b: GraphBuilder; placeholders: Map<ValueId, Value>; ids: WeakMap<Value, ValueId> } | undefined;
  readonly #seconds = new Map<number, number>();
  readonly #bytes: (number | undefined)[] = [];
  // NOTE: computed on first need (a budget check or `estimate`): it walks every value, and with
  // an unlimited budget no rule ever needs it.
  #constantBytes: number | undefined;

  constructor(graph: Graph, bt: BindingTimes, ctx: ResolvedContext) {
    this.ctx = ctx;
    this.wg = new WorkGraph(graph, bt);
    this.wg.cutoff = ctx.cutoff;
    this.slower = new MatchSignatures(this.wg);
    this.ruleContext = this.#makeRuleContext();
  }

  /** The handle rules see for a graph value (stable per value). */
  workValue(v: ValueId): Value {
    let h = this.#handles[v];
    if (h === undefined) {
      h = Object.freeze({ id: v, name: this.wg.displayName(v), type: this.wg.types[v]! });
      this.#handles[v] = h;
      this.#ids.set(h, v);
    }
    return h;
  }

  #idOf(v: Value): ValueId {
    const id = this.#ids.get(v) ?? this.#build?.ids.get(v);
    if (id === undefined) throw new RewriteError(RwCode.BAD_RULE, `context queries take values of the graph being rewritten; %${v.name} is not one`);
    return id;
  }

  /** Captures as graph-value handles (for guards). */
  workCaptures(caps: ReadonlyMap<string, ValueId>): Record<string, Value> {
    const out: Record<string, Value> = {};
    for (const [k, v] of caps) out[k] = this.workValue(v);
    return out;
  }

  /** Starts a rule's build: a fresh IR builder whose inputs stand for the captured values. */
  beginBuild(caps: ReadonlyMap<string, ValueId>): GraphBuilder {
    const b = new GraphBuilder(this.wg.name);
    this.#build = { b, placeholders: new Map(), ids: new WeakMap() };
    for (const v of caps.values()) this.#placeholder(v);
    return b;
  }

  #placeholder(v: ValueId): Value {
    const st = this.#build;
    if (st === undefined) throw new RewriteError(RwCode.BAD_RULE, 'ctx.handle is only available while a rule builds');
    let h = st.placeholders.get(v);
    if (h === undefined) {
      h = st.b.input(this.wg.names[v]!, this.wg.types[v]!);
      st.placeholders.set(v, h);
      st.ids.set(h, v);
    }
    return h;
  }

  /** Captures as builder values (for builders). */
  buildCaptures(caps: ReadonlyMap<string, ValueId>): Record<string, Value> {
    const out: Record<string, Value> = {};
    for (const [k, v] of caps) out[k] = this.#placeholder(v);
    return out;
  }

  /** Ends a rule's build. */
  endBuild(): void {
    this.#build = undefined;
  }

  /**
   * Copies the nodes a rule built into the working graph (hash-consed against it: an existing
   * equal node, live or dead, is reused) and returns the value standing for `out`.
   */
  translate(b: GraphBuilder, out: Value, root: ValueId, rule: string): ValueId {
    const built = b.build();
    const st = this.#build!;
    const map = new Map<number, ValueId>();
    for (const [v, h] of st.placeholders) map.set(h.id, v);
    const rootName = this.wg.displayName(root);
    if (built.values[out.id]?.name !== out.name) throw new RewriteError(RwCode.BAD_RULE, `rule '${rule}' returned a value its builder did not make`);
    for (const n of built.nodes) {
      if (n.kind === 'input') continue;
      if (n.kind === 'param') throw new RewriteError(RwCode.BAD_RULE, `rule '${rule}' declared parameter '${n.name}'; rules may only add op nodes`);
      const operands = n.operands.map((o) => map.get(o)!);
      if (operands.includes(root)) throw new RewriteError(RwCode.BAD_RULE, `rule '${rule}' built a replacement of %${rootName} that uses %${rootName} itself`);
      const key = opKey(n.op, operands, attrKeyOf(n.attrs));
      const hit = key === undefined ? undefined : this.wg.intern.get(key);
      const results =
        hit !== undefined
          ? this.wg.nodes[hit]!.results.map((r) => this.wg.canonical(r))
          : this.wg.nodes[
              this.wg.addNode(
                n.op,
                operands,
                n.attrs,
                n.results.map((r) => built.values[r]!.type),
                n.results.map((r) => `${rootName}.${built.values[r]!.name}`),
              )
            ]!.results;
      n.results.forEach((r, k) => map.set(r, results[k]!));
    }
    return map.get(out.id)!;
  }

  #isDynNode(n: number): boolean {
    const node = this.wg.nodes[n]!;
    return node.kind === 'op' && this.wg.stages[node.results[0]!]! > this.ctx.cutoff;
  }

  #nodeSeconds(n: number): number {
    let s = this.#seconds.get(n);
    if (s === undefined) {
      const node = this.wg.nodes[n]!;
      const t = (v: ValueId): TensorType => this.wg.types[v]!;
      s = this.ctx.costModel.opCost(node.op, node.operands.map(t), node.results.map(t), node.attrs, this.ctx.sizes).seconds;
      this.#seconds.set(n, s);
    }
    return s;
  }

  #dynUses(v: ValueId): number {
    let k = this.wg.outRefs[v]!;
    for (const u of this.wg.users[v]!) if (this.#isDynNode(u)) k++;
    return k;
  }

  #valueBytes(v: ValueId): number {
    const cached = this.#bytes[v];
    if (cached !== undefined) return cached;
    const n = this.wg.nodes[this.wg.nodeOf[v]!]!;
    const t = this.wg.types[v]!;
    const inline = n.kind === 'op' && n.operands.length === 0 && opDef(n.op).traits.includes('constant-like') && evalDimAt(numElements(t), this.ctx.sizes) <= this.ctx.inlineElements;
    const bytes = inline ? 0 : this.ctx.costModel.constantBytes(t, this.ctx.sizes);
    this.#bytes[v] = bytes;
    return bytes;
  }

  /** Bytes `v` adds to the constant table (static, live and read by a dynamic node or an output). */
  #frontierBytes(v: ValueId, dynDelta: number, alive: boolean): number {
    if (!alive || !this.wg.isStatic(v) || this.#dynUses(v) + dynDelta <= 0) return 0;
    return this.#valueBytes(v);
  }

  /**
   * Effect of replacing `v` by `r` (after bringing in `fresh`) on the residual, without changing
   * anything: use counts are simulated to find the nodes that would die. Under a cost guard, a
   * rewrite that makes requests slower is rejected whatever its memory effect, so its constant
   * bytes are not computed (reported as NaN).
   */
  simulate(v: ValueId, r: ValueId, fresh: readonly number[], guard: CostGuard): Delta {
    const wg = this.wg;
    const rc = new Map<number, number>();
    const dyn = new Map<number, number>();
    for (const n of fresh) {
      const d = this.#isDynNode(n);
      for (const o of wg.nodes[n]!.operands) {
        add(rc, o, 1);
        if (d) add(dyn, o, 1);
      }
    }
    const uses = wg.useCount(v);
    const dv = this.#dynUses(v);
    add(rc, r, uses);
    add(rc, v, -uses);
    add(dyn, r, dv);
    add(dyn, v, -dv);
    const dead = new Set<number>();
    const stack = [wg.nodeOf[v]!];
    while (stack.length > 0) {
      const n = stack.pop()!;
      const node = wg.nodes[n]!;
      if (dead.has(n) || !node.alive || node.kind !== 'op') continue;
      if (node.results.some((x) => wg.useCount(x) + (rc.get(x) ?? 0) > 0)) continue;
      dead.add(n);
      const d = this.#isDynNode(n);
      for (const o of node.operands) {
        add(rc, o, -1);
        if (d) add(dyn, o, -1);
        if (wg.useCount(o) + (rc.get(o) ?? 0) === 0) stack.push(wg.nodeOf[o]!);
      }
    }
    let added = 0;
    let removed = 0;
    for (const n of fresh) if (this.#isDynNode(n)) added += this.#nodeSeconds(n);
    for (const n of dead) if (this.#isDynNode(n)) removed += this.#nodeSeconds(n);
    // NOTE: time sums are compared after cancelling identical work; differences within rounding of
    // the larger sum count as equal, so a neutral rewrite is not mistaken for a gain or a loss.
    const seconds = Math.abs(added - removed) <= 1e-9 * Math.max(added, removed) ? 0 : added - removed;
    if (seconds > 0 && guard !== 'none') return { seconds, constantBytes: Number.NaN };
    const affected = new Set<ValueId>([v, r, ...dyn.keys()]);
    for (const n of [...fresh, ...dead]) for (const x of wg.nodes[n]!.results) affected.add(x);
    const freshSet = new Set(fresh);
    let bytes = 0;
    for (const x of affected) {
      const node = wg.nodeOf[x]!;
      const aliveAfter = (wg.nodes[node]!.alive && !dead.has(node)) || freshSet.has(node);
      bytes += this.#frontierBytes(x, dyn.get(x) ?? 0, aliveAfter) - this.#frontierBytes(x, 0, wg.nodes[node]!.alive);
    }
    return { seconds, constantBytes: bytes };
  }

  /** Starts watching whether a rule looks past its match (`def`, `opOf`, `handle`, `literal`, `splat`, or `attrs` of an unmatched node). */
  watch(matched: readonly number[]): void {
    this.#matched = matched;
    this.#looked = false;
  }

  /**
   * Whether the cost of this application is a function of its signature: the rule looked only at
   * its captures, and every capture used only inside the match survives (the replacement uses it),
   * so nothing below the match dies with it.
   */
  isLocal(captures: ReadonlyMap<string, ValueId>, matched: readonly number[], fresh: readonly number[]): boolean {
    if (this.#looked) return false;
    const wg = this.wg;
    const inside = new Map<ValueId, number>();
    for (const n of matched) for (const o of wg.nodes[n]!.operands) inside.set(o, (inside.get(o) ?? 0) + 1);
    for (const v of captures.values()) {
      if (matched.includes(wg.nodeOf[v]!) || wg.nodes[wg.nodeOf[v]!]!.kind !== 'op' || wg.useCount(v) > (inside.get(v) ?? 0)) continue;
      if (!fresh.some((n) => wg.nodes[n]!.operands.includes(v))) return false;
    }
    return true;
  }

  /** Bytes of the residual's constant table now. */
  constantBytes(): number {
    if (this.#constantBytes === undefined) {
      let total = 0;
      for (let v = 0; v < this.wg.names.length; v++) total += this.#frontierBytes(v, 0, this.wg.nodes[this.wg.nodeOf[v]!]!.alive);
      this.#constantBytes = total;
    }
    return this.#constantBytes;
  }

  /** Whether a rewrite with effect `d` passes guard `g` under the context's budget. */
  accepts(g: CostGuard, d: Delta): boolean {
    switch (g) {
      case 'none':
        return true;
      case 'no-worse':
        return d.seconds <= 0 && d.constantBytes <= 0;
      case 'improving': {
        const fits = d.constantBytes <= 0 || this.ctx.memoryBudget === Number.POSITIVE_INFINITY || this.constantBytes() + d.constantBytes <= this.ctx.memoryBudget;
        return fits && (d.seconds < 0 || (d.seconds === 0 && d.constantBytes < 0));
      }
    }
  }

  /** Applies a checked rewrite and returns its log entry. */
  commit(app: Application): RewriteLogEntry {
    const wg = this.wg;
    const node = wg.displayName(app.root);
    // NOTE: the log's text is formatted on first read; most runs (and the benchmark) never read it.
    const beforeLines = wg.topological(app.matched).map((n) => wg.nodeTextLater(n));
    wg.revive(app.fresh);
    const isNew = app.fresh.includes(wg.nodeOf[app.replacement]!);
    if (isNew && wg.hints[app.replacement] === undefined) wg.hints[app.replacement] = node;
    wg.replace(app.root, app.replacement);
    if (this.#constantBytes !== undefined) this.#constantBytes += app.delta.constantBytes;
    const reused = `%${wg.displayName(app.replacement)}`;
    const afterLines = isNew ? app.fresh.map((n) => wg.nodeTextLater(n)) : [() => reused];
    let before: string | undefined;
    let after: string | undefined;
    return {
      rule: app.rule,
      node,
      get before(): string {
        before ??= beforeLines.map((f) => f()).join('\n');
        return before;
      },
      get after(): string {
        after ??= afterLines.map((f) => f()).join('\n');
        return after;
      },
      matched: [...app.matched].sort((a, b) => a - b),
      seconds: app.delta.seconds,
      constantBytes: app.delta.constantBytes,
    };
  }

  /** The residual's estimated per-request time and constant bytes, from the working graph. */
  estimate(): ResidualEstimate {
    let seconds = 0;
    this.wg.nodes.forEach((n, i) => {
      if (n.alive && this.#isDynNode(i)) seconds += this.#nodeSeconds(i);
    });
    return { seconds, constantBytes: this.constantBytes() };
  }

  #makeRuleContext(): RuleContext {
    const wg = this.wg;
    const ctx = this.ctx;
    const def = (v: Value): ValueDef | undefined => {
      this.#looked = true;
      const p = wg.producer(this.#idOf(v));
      return p === undefined ? undefined : { op: p.op, attrs: p.attrs, operands: p.operands.map((o) => this.workValue(o)) };
    };
    const constantBytes = (): number => this.constantBytes();
    return {
      lattice: ctx.lattice,
      cutoff: ctx.cutoff,
      sizes: ctx.sizes,
      costModel: ctx.costModel,
      memoryBudget: ctx.memoryBudget,
      maxFoldElements: ctx.maxFoldElements,
      get constantBytes(): number {
        return constantBytes();
      },
      stageOf: (v) => wg.stages[this.#idOf(v)]!,
      isStatic: (v) => wg.isStatic(this.#idOf(v)),
      isDynamic: (v) => !wg.isStatic(this.#idOf(v)),
      uses: (v) => wg.useCount(this.#idOf(v)),
      def,
      opOf: (v) => {
        this.#looked = true;
        return wg.producer(this.#idOf(v))?.op;
      },
      attrs: <K extends OpKey>(v: Value, op: K): AttrsOf<K> => {
        const p = wg.producer(this.#idOf(v));
        if (p?.op !== op) throw new RewriteError(RwCode.BAD_RULE, `%${v.name} is not defined by ${op}`);
        if (!this.#matched.includes(p.node)) this.#looked = true;
        return p.attrs as AttrsOf<K>;
      },
      splat: (v) => {
        this.#looked = true;
        return wg.splat(this.#idOf(v));
      },
      literal: (v): HostTensor | undefined => {
        const d = def(v);
        return d?.op === 'constant' ? opDef('constant').evaluate([], d.attrs, { random: seededRandom(0) })[0] : undefined;
      },
      handle: (v) => {
        this.#looked = true;
        return this.#placeholder(this.#idOf(v));
      },
      size: (d) => evalDimAt(d, ctx.sizes),
    };
  }
}
