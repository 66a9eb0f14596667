import { StructuredCode, StructuredError } from './errors.js';

/** What `vocabularyOf` reads of a tokenizer (`TextTokenizer` of `@stageml/models` has it). */
export interface VocabSource {
  /** The vocabulary string of one id (`Ġthe`, `▁the`, `<0xE4>`), or undefined. */
  tokenOf(id: number): string | undefined;
  /** Ids never produced as text (chat markers, BOS, EOS): never allowed by a constraint. */
  readonly specialIds: ReadonlySet<number>;
}

/**
 * A tokenizer's vocabulary as byte strings, with a trie over them: token masks walk the trie once,
 * so a step costs one automaton transition per trie node reached rather than per token byte.
 */
export class Vocabulary {
  /** Number of ids (the logits' length may be larger: ids past it are never allowed). */
  readonly size: number;
  /** Bytes of each id; undefined for special or unknown ids. */
  readonly tokens: readonly (Uint8Array | undefined)[];
  /** Trie: first child index and child count per node; children sorted by byte. */
  readonly childStart: Int32Array;
  readonly childCount: Int32Array;
  readonly childByte: Uint8Array;
  /** Token ids ending at each node: `endIds[endStart[n] .. endStart[n + 1])`. */
  readonly endStart: Int32Array;
  readonly endIds: Int32Array;

  /** A vocabulary of `tokens` (bytes per id; undefined: never allowed). */
  constructor(tokens: readonly (Uint8Array | undefined)[]) {
    this.size = tokens.length;
    this.tokens = tokens;
    // Build with maps, then flatten breadth-first so each node's children are contiguous.
    const kids: Map<number, number>[] = [new Map<number, number>()];
    const ends: number[][] = [[]];
    tokens.forEach((t, id) => {
      if (t === undefined || t.length === 0) return;
      let n = 0;
      for (const b of t) {
        let c = kids[n]!.get(b);
        if (c === undefined) {
          c = kids.length;
          kids.push(new Map<number, number>());
          ends.push([]);
          kids[n]!.set(b, c);
        }
        n = c;
      }
      ends[n]!.push(id);
    });
    const order: number[] = [0];
    const newId = new Int32Array(kids.length);
    // Appended children are visited too: the loop walks the trie breadth-first.
    for (const n of order) {
      for (const b of [...kids[n]!.keys()].sort((x, y) => x - y)) {
        newId[kids[n]!.get(b)!] = order.length;
        order.push(kids[n]!.get(b)!);
      }
    }
    const N = order.length;
    this.childStart = new Int32Array(N);
    this.childCount = new Int32Array(N);
    this.childByte = new Uint8Array(N);
    this.endStart = new Int32Array(N + 1);
    const endIds: number[] = [];
    order.forEach((old, i) => {
      const ks = [...kids[old]!.entries()].sort((x, y) => x[0] - y[0]);
      this.childCount[i] = ks.length;
      this.childStart[i] = ks.length === 0 ? 0 : newId[ks[0]![1]]!;
      for (const [b, c] of ks) this.childByte[newId[c]!] = b;
      this.endStart[i] = endIds.length;
      endIds.push(...ends[old]!);
    });
    this.endStart[N] = endIds.length;
    this.endIds = Int32Array.from(endIds);
  }

  /** Number of trie nodes. */
  get nodeCount(): number {
    return this.childStart.length;
  }
}

/** GPT-2's byte ↔ printable character table, as byte-level BPE vocabularies spell bytes. */
function byteLevelDecoder(): Map<string, number> {
  const printable = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  const m = new Map<string, number>();
  let extra = 0;
  for (let b = 0; b < 256; b++) m.set(String.fromCharCode(printable(b) ? b : 256 + extra++), b);
  return m;
}

const enc = new TextEncoder();
const BYTE_TOKEN = /^<0x([0-9A-Fa-f]{2})>$/;

/**
 * The vocabulary of a tokenizer, `size` ids: byte-level BPE tokens (`Ġ`, `Ċ` spelling bytes: GPT-2,
 * Llama 3, SmolLM, Qwen) are mapped through GPT-2's byte table; SentencePiece-style tokens (`▁`
 * for a space, `<0xNN>` byte fallback: Llama 2, Mistral) through theirs. The style is chosen by
 * which spelling the vocabulary uses. Special ids and ids without a string are never allowed.
 */
export function vocabularyOf(tok: VocabSource, size: number): Vocabulary {
  if (!(Number.isSafeInteger(size) && size > 0)) throw new StructuredError(StructuredCode.BAD_SPEC, `vocabulary size must be a positive integer, got ${String(size)}`);
  const strings: (string | undefined)[] = [];
  for (let id = 0; id < size; id++) strings.push(tok.specialIds.has(id) ? undefined : tok.tokenOf(id));
  const bl = byteLevelDecoder();
  let byteLevel = 0;
  let sentencePiece = 0;
  for (const s of strings) {
    if (s === undefined) continue;
    if (s.includes('\u2581')) sentencePiece++;
    if (s.includes('\u0120') || s.includes('\u010a')) byteLevel++;
  }
  const useByteLevel = byteLevel >= sentencePiece;
  const tokens = strings.map((s): Uint8Array | undefined => {
    if (s === undefined) return undefined;
    const m = BYTE_TOKEN.exec(s);
    if (m !== null) return Uint8Array.of(parseInt(m[1]!, 16));
    if (useByteLevel) {
      const out = new Uint8Array(s.length);
      for (let i = 0; i < s.length; i++) {
        const b = bl.get(s[i]!);
        // A character outside the byte table (an added, non-special token): its UTF-8 text.
        if (b === undefined) return enc.encode(s);
        out[i] = b;
      }
      return out;
    }
    return enc.encode(s.replaceAll('\u2581', ' '));
  });
  return new Vocabulary(tokens);
}
