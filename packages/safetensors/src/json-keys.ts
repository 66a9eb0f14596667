/** A key that occurs twice in one JSON object. */
export interface DuplicateKey {
  /** The repeated key (decoded). */
  readonly key: string;
  /** Keys leading from the root to the object holding the duplicate (empty for the root). */
  readonly path: readonly string[];
}

interface Frame {
  /** Keys seen so far, or null for an array. */
  readonly keys: Set<string> | null;
  /** The key this container sits under in its parent (root: none). */
  readonly under: string | undefined;
  expectKey: boolean;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * Finds the first key repeated within one object of `text`, which must already be well-formed
 * JSON (run `JSON.parse` first). `JSON.parse` keeps the last of duplicate keys silently, so a
 * header could otherwise say two things about one tensor and be read differently by other tools.
 */
export function findDuplicateKey(text: string): DuplicateKey | undefined {
  const stack: Frame[] = [];
  let pendingKey: string | undefined;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === QUOTE) {
      const end = stringEnd(text, i);
      const top = stack[stack.length - 1];
      if (top?.keys != null && top.expectKey) {
        const raw = text.slice(i, end + 1);
        const key = raw.includes('\\') ? (JSON.parse(raw) as string) : raw.slice(1, -1);
        if (top.keys.has(key)) return { key, path: pathOf(stack) };
        top.keys.add(key);
        top.expectKey = false;
        pendingKey = key;
      }
      i = end;
    } else if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
      stack.push({ keys: c === 0x7b ? new Set() : null, under: pendingKey, expectKey: true });
      pendingKey = undefined;
    } else if (c === 0x7d /* } */ || c === 0x5d /* ] */) {
      stack.pop();
    } else if (c === 0x2c /* , */) {
      const top = stack[stack.length - 1];
      if (top?.keys != null) top.expectKey = true;
      pendingKey = undefined;
    }
  }
  return undefined;
}

/** Index of the closing quote of the string opening at `start`. */
function stringEnd(text: string, start: number): number {
  let j = start + 1;
  for (;;) {
    const q = text.indexOf('"', j);
    if (q < 0) return text.length - 1;
    let backslashes = 0;
    for (let k = q - 1; k > start && text.charCodeAt(k) === BACKSLASH; k--) backslashes++;
    if (backslashes % 2 === 0) return q;
    j = q + 1;
  }
}

function pathOf(stack: readonly Frame[]): string[] {
  const path: string[] = [];
  for (const f of stack) if (f.under !== undefined) path.push(f.under);
  return path;
}
