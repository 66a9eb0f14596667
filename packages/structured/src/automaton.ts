import { type Expr, type Grammar } from './grammar.js';
import { StructuredCode, StructuredError } from './errors.js';

const BYTE = 0;
const SPLIT = 1;
const CALL = 2;
const RET = 3;
/** The kind of the accept program counter. */
const DONE = 4;
/** The program counter of a thread that has matched the whole root rule. */
const ACCEPT = 0;
const STACK_SCALE = 2 ** 32;
/** Most unrolled copies of a bounded repetition. */
const MAX_UNROLL = 4096;
/** Most rule calls one closure may nest without consuming a byte (deeper: left recursion). */
const MAX_CALL_DEPTH = 2048;

/** Interned set of threads (program counter + call stack) with its byte transitions. */
interface DState {
  readonly pcs: Int32Array;
  readonly stacks: Float64Array;
  /** Some thread has matched the whole grammar. */
  readonly accepting: boolean;
  /** Some thread can still consume a byte. */
  readonly live: boolean;
  /** Next state per byte: -2 not computed yet, -1 dead. */
  readonly next: Int32Array;
}

/**
 * A grammar compiled to a byte-level pushdown automaton (a Thompson program whose rule calls
 * push return addresses). Matching states — sets of threads, each a program counter and an
 * interned call stack — are interned, so a state reached again costs one table lookup per byte:
 * `step` is memoized per state and byte.
 */
export class Automaton {
  readonly #kind: number[] = [DONE];
  readonly #next: number[] = [-1];
  readonly #sets: (Uint8Array | undefined)[] = [undefined];
  readonly #alts: (number[] | undefined)[] = [undefined];
  readonly #callee: number[] = [-1];
  readonly #ruleStart = new Map<string, number>();
  readonly #stackKeys = new Map<number, number>();
  readonly #stackParent: number[] = [-1];
  readonly #stackRet: number[] = [-1];
  readonly #stackDepth: number[] = [0];
  readonly #stateKeys = new Map<string, number>();
  readonly #states: DState[] = [];
  /** The initial state's id. */
  readonly start: number;

  /** Compiles `g`; an undefined rule or an over-large repetition is `STRUCT_BAD_GRAMMAR`. */
  constructor(g: Grammar) {
    const ret = this.#add(RET, -1);
    const pending: [string, number][] = [];
    const ruleOf = (name: string): number => {
      let s = this.#ruleStart.get(name);
      if (s === undefined) {
        if (!g.rules.has(name)) throw new StructuredError(StructuredCode.BAD_GRAMMAR, `rule '${name}' is referenced but not defined`);
        s = this.#add(SPLIT, -1);
        this.#ruleStart.set(name, s);
        pending.push([name, s]);
      }
      return s;
    };
    const compile = (e: Expr, next: number): number => {
      switch (e.k) {
        case 'bytes': {
          const s = this.#add(BYTE, next);
          this.#sets[s] = e.set;
          return s;
        }
        case 'seq': {
          let s = next;
          for (let i = e.items.length - 1; i >= 0; i--) s = compile(e.items[i]!, s);
          return s;
        }
        case 'alt': {
          const s = this.#add(SPLIT, -1);
          this.#alts[s] = e.items.map((x) => compile(x, next));
          return s;
        }
        case 'rep': {
          const { min, max } = e;
          if (!(Number.isInteger(min) && min >= 0 && (max === Infinity || (Number.isInteger(max) && max >= min)))) {
            throw new StructuredError(StructuredCode.BAD_GRAMMAR, `bad repetition bounds {${String(min)},${String(max)}}`);
          }
          if (min > MAX_UNROLL || (max !== Infinity && max > MAX_UNROLL)) throw new StructuredError(StructuredCode.BAD_GRAMMAR, `repetition bound ${String(max === Infinity ? min : max)} is over ${String(MAX_UNROLL)}`);
          let s: number;
          if (max === Infinity) {
            s = this.#add(SPLIT, -1);
            this.#alts[s] = [compile(e.item, s), next];
          } else {
            s = next;
            for (let i = 0; i < max - min; i++) {
              const split = this.#add(SPLIT, -1);
              this.#alts[split] = [compile(e.item, s), next];
              s = split;
            }
          }
          for (let i = 0; i < min; i++) s = compile(e.item, s);
          return s;
        }
        case 'ref': {
          const s = this.#add(CALL, next);
          this.#callee[s] = ruleOf(e.name);
          return s;
        }
      }
    };
    const root = ruleOf(g.root);
    while (pending.length > 0) {
      const [name, s] = pending.pop()!;
      this.#alts[s] = [compile(g.rules.get(name)!, ret)];
    }
    const init = this.#add(CALL, ACCEPT);
    this.#callee[init] = root;
    this.start = this.#closeFrom([[init, 0]]);
  }

  #add(kind: number, next: number): number {
    // Return addresses are packed beside stack ids in 20 bits (see #push).
    if (this.#kind.length >= 2 ** 20) throw new StructuredError(StructuredCode.BAD_GRAMMAR, `the grammar compiles to more than ${String(2 ** 20)} states (reduce repetition bounds such as maxLength/maxItems)`);
    this.#kind.push(kind);
    this.#next.push(next);
    this.#sets.push(undefined);
    this.#alts.push(undefined);
    this.#callee.push(-1);
    return this.#kind.length - 1;
  }

  #push(stack: number, ret: number): number {
    const key = stack * 2 ** 20 + ret;
    let id = this.#stackKeys.get(key);
    if (id === undefined) {
      id = this.#stackParent.length;
      this.#stackParent.push(stack);
      this.#stackRet.push(ret);
      this.#stackDepth.push(this.#stackDepth[stack]! + 1);
      this.#stackKeys.set(key, id);
    }
    return id;
  }

  /** The interned state of the closure of `starts` (program counters with stacks). */
  #closeFrom(starts: readonly (readonly [number, number])[]): number {
    const seen = new Set<number>();
    const threads: number[] = [];
    const work = starts.map(([pc, st]) => [pc, st, 0] as [number, number, number]);
    while (work.length > 0) {
      const [pc, st, calls] = work.pop()!;
      const key = pc * STACK_SCALE + st;
      if (seen.has(key)) continue;
      seen.add(key);
      switch (this.#kind[pc]!) {
        case DONE:
        case BYTE:
          threads.push(key);
          break;
        case SPLIT:
          for (const a of this.#alts[pc]!) work.push([a, st, calls]);
          break;
        case CALL:
          if (calls >= MAX_CALL_DEPTH) throw new StructuredError(StructuredCode.BAD_GRAMMAR, 'the grammar is left-recursive (a rule reaches itself without consuming input)');
          work.push([this.#callee[pc]!, this.#push(st, this.#next[pc]!), calls + 1]);
          break;
        case RET:
          work.push([this.#stackRet[st]!, this.#stackParent[st]!, calls]);
          break;
      }
    }
    threads.sort((a, b) => a - b);
    const id = threads.join(',');
    const known = this.#stateKeys.get(id);
    if (known !== undefined) return known;
    const pcs = new Int32Array(threads.length);
    const stacks = new Float64Array(threads.length);
    threads.forEach((t, i) => {
      pcs[i] = Math.floor(t / STACK_SCALE);
      stacks[i] = t % STACK_SCALE;
    });
    const accepting = pcs.includes(ACCEPT);
    const state: DState = { pcs, stacks, accepting, live: threads.length > (accepting ? 1 : 0), next: new Int32Array(256).fill(-2) };
    this.#states.push(state);
    this.#stateKeys.set(id, this.#states.length - 1);
    return this.#states.length - 1;
  }

  /** The state after `byte` from `state`, or -1 when the grammar does not allow it there. */
  step(state: number, byte: number): number {
    const s = this.#states[state]!;
    const known = s.next[byte]!;
    if (known !== -2) return known;
    const starts: [number, number][] = [];
    for (let i = 0; i < s.pcs.length; i++) {
      const pc = s.pcs[i]!;
      if (this.#kind[pc] === BYTE && this.#sets[pc]![byte] === 1) starts.push([this.#next[pc]!, s.stacks[i]!]);
    }
    const to = starts.length === 0 ? -1 : this.#closeFrom(starts);
    s.next[byte] = to;
    return to;
  }

  /** The state after all of `bytes`, or -1. */
  stepAll(state: number, bytes: ArrayLike<number>): number {
    let s = state;
    for (let i = 0; i < bytes.length && s >= 0; i++) s = this.step(s, bytes[i]!);
    return s;
  }

  /** Whether the text so far is a complete match. */
  accepting(state: number): boolean {
    return this.#states[state]!.accepting;
  }

  /** Whether more bytes can follow (false: the match is complete and nothing may be added). */
  live(state: number): boolean {
    return this.#states[state]!.live;
  }

  /** Whether `text` matches the whole grammar. */
  matches(text: string): boolean {
    const s = this.stepAll(this.start, new TextEncoder().encode(text));
    return s >= 0 && this.accepting(s);
  }

  /** How many matching states have been interned (for cache sizing and tests). */
  get stateCount(): number {
    return this.#states.length;
  }
}
