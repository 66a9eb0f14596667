// A generated block of a markdown file: the text between two HTML-comment markers, which
// `pnpm docs:ops` and `pnpm docs:serve-flags` rewrite and tests keep current.

/** `text` with what stands between `begin` and `end` replaced by `body`; missing markers are a TypeError naming `doc`. */
export function replaceBetweenMarkers(text: string, begin: string, end: string, body: string, doc: string): string {
  const i = text.indexOf(begin);
  const j = text.indexOf(end);
  if (i < 0 || j < i) throw new TypeError(`${doc} lacks the markers ${begin} … ${end}`);
  return `${text.slice(0, i + begin.length)}\n${body}\n${text.slice(j)}`;
}
