import type { BindingTimes } from '@stageml/annotations';
import {
  type AttrValue,
  type Dim,
  type Graph,
  type GraphNode,
  type OpKey,
  type TensorType,
  type ValueId,
  type ValueInfo,
  internKeyReplacer,
  isDefaultAttr,
  opDef,
  printAttr,
  printName,
  typeToString,
} from '@stageml/ir';
import type { MatchView } from './match.js';

/** A node of the working graph: like the IR's, with mutable operands and a liveness flag. */
export interface WorkNode {
  readonly kind: 'input' | 'param' | 'op';
  /** Leaf name (inputs and parameters). */
  readonly name: string;
  /** Registry key (op nodes; `constant` is a placeholder for leaves). */
  readonly op: OpKey;
  /** Current operands (updated when a value is replaced). */
  readonly operands: ValueId[];
  /** Normalized attributes. */
  readonly attrs: Readonly<Record<string, AttrValue>>;
  /** Result values. */
  readonly results: readonly ValueId[];
  /** Whether the node is part of the graph (reachable from an output); leaves always are. */
  alive: boolean;
  /** Hash-consing key of pure op nodes (current operands), else undefined. */
  key: string | undefined;
  /** Attribute part of the key, computed once. */
  readonly attrKey: string;
  /** Index of the node in `WorkGraph.nodes`. */
  readonly node: number;
}

const isOdd = (x: unknown): boolean => typeof x === 'number' && (!Number.isFinite(x) || Object.is(x, -0));

/** Text of attributes for hash-consing keys. */
export function attrKeyOf(attrs: Readonly<Record<string, AttrValue>>): string {
  // The replacer is slow; only literals that hold a NaN, an infinity or a −0 need it.
  const odd = Object.values(attrs).some((v) => isOdd(v) || (Array.isArray(v) && v.some(isOdd)));
  return JSON.stringify(attrs, odd ? internKeyReplacer : undefined);
}

/** Hash-consing key of a pure op application (operands sorted for commutative ops), else undefined. */
export function opKey(op: OpKey, operands: readonly ValueId[], attrKey: string): string | undefined {
  const def = opDef(op);
  if (def.effect !== 'pure') return undefined;
  const ids = def.traits.includes('commutative') && operands.length === 2 && operands[0]! > operands[1]! ? [operands[1]!, operands[0]!] : operands;
  return `${op}(${ids.join(',')})${attrKey}`;
}

/**
 * The driver's mutable working copy of a graph: users lists, output references, binding times and
 * a hash-consing table, so a replacement costs only the size of what it touches. Values are never
 * renumbered; dead nodes stay (they may be revived by hash-consing) until `materialize`.
 */
export class WorkGraph implements MatchView {
  readonly name: string;
  readonly nodes: WorkNode[] = [];
  readonly names: string[] = [];
  readonly types: TensorType[] = [];
  readonly nodeOf: number[] = [];
  readonly stages: number[] = [];
  readonly users: number[][] = [];
  readonly outRefs: number[] = [];
  /** The value a replaced value was replaced by (−1: none). */
  readonly forward: number[] = [];
  /** Preferred printed name (a replacement takes over the name of the value it replaced). */
  readonly hints: (string | undefined)[] = [];
  readonly outputs: { name: string; value: ValueId }[];
  readonly intern = new Map<string, number>();
  readonly taken = new Set<string>();
  readonly #top: number;
  readonly #symbolStage: ReadonlyMap<string, number>;
  readonly #attrSymbols = new Map<number, number>();
  /** Called with every node that dies (the driver revisits its operands' producers). */
  onKill: ((node: number) => void) | undefined;
  /** Set by the driver: the cutoff `isStatic` compares with. */
  cutoff = 0;

  /** Loads `g` (with its binding times), dropping nodes no output needs and merging duplicates. */
  constructor(g: Graph, bt: BindingTimes) {
    this.name = g.name;
    this.#top = bt.lattice.top;
    this.#symbolStage = bt.symbolStage;
    g.values.forEach((v: ValueInfo, id) => {
      this.#pushValue(v.name, v.type, v.node, bt.valueStage[id]!);
    });
    const live = new Uint8Array(g.values.length);
    for (const o of g.outputs) live[o.value] = 1;
    for (let i = g.nodes.length - 1; i >= 0; i--) {
      const n = g.nodes[i]!;
      if (n.kind === 'op' && !n.results.some((r) => live[r] === 1)) continue;
      for (const v of n.operands) live[v] = 1;
    }
    g.nodes.forEach((n: GraphNode, node) => {
      const alive = n.kind !== 'op' || n.results.some((r) => live[r] === 1);
      const attrs = n.kind === 'op' ? n.attrs : {};
      this.nodes.push({ kind: n.kind, name: n.kind === 'op' ? '' : n.name, op: n.kind === 'op' ? n.op : 'constant', operands: [...n.operands], attrs, results: n.results, alive, key: undefined, attrKey: attrKeyOf(attrs), node });
    });
    this.outputs = g.outputs.map((o) => ({ name: o.name, value: o.value }));
    for (const o of this.outputs) this.outRefs[o.value]!++;
    this.nodes.forEach((n, i) => {
      if (n.alive) for (const v of n.operands) this.users[v]!.push(i);
    });
    // CSE of the input: a node equal to an earlier live one is replaced by it.
    this.nodes.forEach((n, i) => {
      if (n.kind !== 'op' || !n.alive) return;
      const key = opKey(n.op, n.operands, n.attrKey);
      if (key === undefined) return;
      const prev = this.intern.get(key);
      if (prev !== undefined && this.nodes[prev]!.alive) {
        n.results.forEach((r, k) => {
          this.replace(r, this.nodes[prev]!.results[k]!);
        });
        return;
      }
      n.key = key;
      this.intern.set(key, i);
    });
  }

  #pushValue(name: string, type: TensorType, node: number, stage: number): ValueId {
    const id = this.names.length;
    this.names.push(name);
    this.taken.add(name);
    this.types.push(type);
    this.nodeOf.push(node);
    this.stages.push(stage);
    this.users.push([]);
    this.outRefs.push(0);
    this.forward.push(-1);
    this.hints.push(undefined);
    return id;
  }

  /** A fresh value name `base`, `base_1`, …. */
  freshName(base: string): string {
    let name = base;
    for (let k = 1; this.taken.has(name); k++) name = `${base}_${String(k)}`;
    return name;
  }

  /** Stage of a new op node: latest of its operands and of the symbols its types and dim attributes mention. */
  stageOfNew(op: OpKey, operands: readonly ValueId[], results: readonly TensorType[], attrs: Readonly<Record<string, AttrValue>>): number {
    const def = opDef(op);
    if (def.effect !== 'pure') return this.#top;
    let s = 0;
    for (const v of operands) s = Math.max(s, this.stages[v]!);
    const dims: Dim[] = results.flatMap((t) => t.shape);
    for (const [name, spec] of Object.entries(def.attrs)) {
      const v = attrs[name];
      if (v === undefined) continue;
      if (spec.kind === 'dim') dims.push(v as Dim);
      else if (spec.kind === 'dims') dims.push(...(v as readonly Dim[]));
    }
    for (const d of dims) {
      if (typeof d === 'number') continue;
      for (const t of d.terms) for (const sym of t.vars) s = Math.max(s, this.#symbolStage.get(sym) ?? this.#top);
    }
    return s;
  }

  /** Adds a (dead) op node; it joins the graph when `revive` reaches it. */
  addNode(op: OpKey, operands: readonly ValueId[], attrs: Readonly<Record<string, AttrValue>>, types: readonly TensorType[], names: readonly string[]): number {
    const index = this.nodes.length;
    const stage = this.stageOfNew(op, operands, types, attrs);
    const results = types.map((t, k) => this.#pushValue(this.freshName(names[k]!), t, index, stage));
    const attrKey = attrKeyOf(attrs);
    const key = opKey(op, operands, attrKey);
    this.nodes.push({ kind: 'op', name: '', op, operands: [...operands], attrs, results, alive: false, key, attrKey, node: index });
    if (key !== undefined) this.intern.set(key, index);
    this.#attrSymbols.delete(index);
    return index;
  }

  /** The live value a hash-consing hit stands for: follows replacements of dead values. */
  canonical(v: ValueId): ValueId {
    let x = v;
    while (!this.nodes[this.nodeOf[x]!]!.alive && this.forward[x]! >= 0) x = this.forward[x]!;
    return x;
  }

  /** Uses of `v`: operand slots of live nodes plus output references. */
  useCount(v: ValueId): number {
    return this.users[v]!.length + this.outRefs[v]!;
  }

  /** Dead nodes `v` needs, operands first (what committing `v` would add). */
  deadReachable(v: ValueId): number[] {
    const out: number[] = [];
    const seen = new Set<number>();
    const walk = (n: number): void => {
      if (seen.has(n) || this.nodes[n]!.alive) return;
      seen.add(n);
      for (const o of this.nodes[n]!.operands) walk(this.nodeOf[o]!);
      out.push(n);
    };
    walk(this.nodeOf[v]!);
    return out;
  }

  /** Brings `nodes` (from `deadReachable`, operands first) into the graph. */
  revive(nodes: readonly number[]): void {
    for (const n of nodes) {
      const node = this.nodes[n]!;
      node.alive = true;
      for (const o of node.operands) this.users[o]!.push(n);
      if (node.key !== undefined) {
        const held = this.intern.get(node.key);
        if (held === undefined || !this.nodes[held]!.alive) this.intern.set(node.key, n);
      }
    }
  }

  /** Redirects every use of `v` (operands and outputs) to `r`, then removes what died. */
  replace(v: ValueId, r: ValueId): void {
    if (v === r) return;
    const merges: [number, number][] = [];
    const touched = new Set<number>();
    for (const u of this.users[v]!) {
      const ops = this.nodes[u]!.operands;
      ops[ops.indexOf(v)] = r;
      this.users[r]!.push(u);
      touched.add(u);
    }
    this.users[v] = [];
    if (this.outRefs[v]! > 0) {
      for (const o of this.outputs) if (o.value === v) o.value = r;
      this.outRefs[r]! += this.outRefs[v]!;
      this.outRefs[v] = 0;
    }
    this.forward[v] = r;
    for (const u of touched) {
      this.#restage(u);
      const other = this.#rekey(u);
      if (other !== undefined) merges.push([u, other]);
    }
    this.kill(this.nodeOf[v]!);
    for (const [u, other] of merges) {
      if (!this.nodes[u]!.alive || !this.nodes[other]!.alive) continue;
      this.nodes[u]!.results.forEach((res, k) => {
        this.replace(res, this.nodes[other]!.results[k]!);
      });
    }
  }

  // A replacement is never later than what it replaces, so users may only get earlier.
  #restage(u: number): void {
    const stack = [u];
    while (stack.length > 0) {
      const n = this.nodes[stack.pop()!]!;
      if (n.kind !== 'op' || opDef(n.op).effect !== 'pure') continue;
      let s = this.#attrSymbolStage(n);
      for (const v of n.operands) s = Math.max(s, this.stages[v]!);
      if (s >= this.stages[n.results[0]!]!) continue;
      for (const r of n.results) {
        this.stages[r] = s;
        stack.push(...this.users[r]!);
      }
    }
  }

  #attrSymbolStage(n: WorkNode): number {
    const index = this.nodeOf[n.results[0]!]!;
    const cached = this.#attrSymbols.get(index);
    if (cached !== undefined) return cached;
    const s = this.stageOfNew(n.op, [], n.results.map((r) => this.types[r]!), n.attrs);
    this.#attrSymbols.set(index, s);
    return s;
  }

  /** Re-keys a node whose operands changed; returns an equal live node it now duplicates. */
  #rekey(u: number): number | undefined {
    const n = this.nodes[u]!;
    if (n.key === undefined) return undefined;
    if (this.intern.get(n.key) === u) this.intern.delete(n.key);
    n.key = opKey(n.op, n.operands, n.attrKey);
    const held = this.intern.get(n.key!);
    if (held !== undefined && held !== u && this.nodes[held]!.alive) return held;
    this.intern.set(n.key!, u);
    return undefined;
  }

  /** Removes node `n` if none of its results is used, and then whatever that leaves unused. */
  kill(n: number): void {
    const stack = [n];
    while (stack.length > 0) {
      const i = stack.pop()!;
      const node = this.nodes[i]!;
      if (node.kind !== 'op' || !node.alive || node.results.some((r) => this.useCount(r) > 0)) continue;
      node.alive = false;
      for (const o of node.operands) {
        const us = this.users[o]!;
        us.splice(us.indexOf(i), 1);
        if (this.useCount(o) === 0) stack.push(this.nodeOf[o]!);
      }
      this.onKill?.(i);
    }
  }

  producer(v: ValueId): WorkNode | undefined {
    const n = this.nodes[this.nodeOf[v]!]!;
    return n.kind === 'op' ? n : undefined;
  }

  isStatic(v: ValueId): boolean {
    return this.stages[v]! <= this.cutoff;
  }

  type(v: ValueId): TensorType {
    return this.types[v]!;
  }

  splat(v: ValueId): number | undefined {
    const n = this.nodes[this.nodeOf[v]!]!;
    if (n.kind !== 'op' || n.op !== 'constant') return undefined;
    const values = n.attrs['value'] as readonly number[];
    if (values.length === 0) return undefined;
    const first = values[0]!;
    return values.every((x) => x === first || (Number.isNaN(x) && Number.isNaN(first))) ? first : undefined;
  }

  /** `nodes` ordered operands before users (new nodes have high indices: index order is not enough). */
  topological(nodes: readonly number[]): number[] {
    const set = new Set(nodes);
    const out: number[] = [];
    const visit = (n: number): void => {
      if (!set.delete(n)) return;
      for (const o of this.nodes[n]!.operands) visit(this.nodeOf[o]!);
      out.push(n);
    };
    for (const n of nodes) visit(n);
    return out;
  }

  /** The name a value prints with. */
  displayName(v: ValueId): string {
    return this.hints[v] ?? this.names[v]!;
  }

  /** One line of generic text for node `n` (`%y = sml.add(%a, %b) : f32[4]`). */
  nodeText(n: number): string {
    return this.nodeTextLater(n)();
  }

  /**
   * The text of node `n` as it is now, formatted when called: names are captured at once (they
   * change as values are replaced), types and attributes never change.
   */
  nodeTextLater(n: number): () => string {
    const node = this.nodes[n]!;
    const res = node.results.map((r) => this.displayName(r));
    const ops = node.operands.map((o) => this.displayName(o));
    return () => {
      const results = res.map((r) => `%${printName(r)}`).join(', ');
      const types = node.results.map((r) => typeToString(this.types[r]!)).join(', ');
      if (node.kind !== 'op') return `${results} = ${node.kind} : ${types}`;
      const def = opDef(node.op);
      const attrs = Object.entries(def.attrs).flatMap(([name, spec]) => {
        const v = node.attrs[name];
        return v === undefined || isDefaultAttr(spec, v) ? [] : [`${name} = ${printAttr(spec, v)}`];
      });
      return `${results} = ${def.name}(${ops.map((o) => `%${printName(o)}`).join(', ')})${attrs.length === 0 ? '' : ` {${attrs.join(', ')}}`} : ${types}`;
    };
  }
}
