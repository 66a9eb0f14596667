/**
 * Deepest array/object nesting of JSON `text`, by one linear scan that skips strings (escapes
 * included). No recursion, so hostile nesting cannot overflow the stack; callers refuse text
 * deeper than their format needs before handing it to `JSON.parse` and recursive consumers.
 * Malformed text still gets a number; `JSON.parse` reports its syntax.
 */
export function jsonDepth(text: string): number {
  let depth = 0;
  let max = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      for (i++; i < text.length && text.charCodeAt(i) !== 0x22; i++) if (text.charCodeAt(i) === 0x5c) i++;
    } else if (c === 0x7b || c === 0x5b) max = Math.max(max, ++depth);
    else if (c === 0x7d || c === 0x5d) depth--;
  }
  return max;
}
