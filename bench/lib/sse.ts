// Server-sent events of the OpenAI-style streaming endpoints, as the serving benchmarks read them.

/** Calls `on` with each `data:` payload of a server-sent event stream as it arrives (`[DONE]` left out). */
export async function streamEvents(r: Response, on: (data: string) => void): Promise<void> {
  const reader = r.body!.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i: number;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (ev.startsWith('data: ') && ev !== 'data: [DONE]') on(ev.slice(6));
    }
  }
}
