import { describe, expect, it } from 'vitest';
import { decodePhase, splitEvents, tokenGaps } from './sse.js';

describe('splitEvents', () => {
  it('returns complete events and keeps the unfinished rest', () => {
    expect(splitEvents('data: {"a":1}\n\ndata: {"b"')).toEqual({ data: ['{"a":1}'], rest: 'data: {"b"' });
    expect(splitEvents('data: x\n\ndata: y\n\n')).toEqual({ data: ['x', 'y'], rest: '' });
  });

  it('leaves out [DONE], comments and events without data, and reads CRLF line ends', () => {
    expect(splitEvents(': keep-alive\n\nevent: ping\n\ndata: [DONE]\n\n').data).toEqual([]);
    expect(splitEvents('data: a\r\n\r\ndata:b\r\n\r\n').data).toEqual(['a', 'b']);
  });

  it('joins the data lines of one event', () => {
    expect(splitEvents('data: one\ndata: two\n\n').data).toEqual(['one\ntwo']);
  });

  it('gives the same events however the text is cut into chunks', () => {
    const text = 'data: {"t":1}\n\ndata: {"t":2}\n\n: c\n\ndata: {"t":3}\n\ndata: [DONE]\n\n';
    for (let cut = 0; cut <= text.length; cut++) {
      const first = splitEvents(text.slice(0, cut));
      const second = splitEvents(first.rest + text.slice(cut));
      expect([...first.data, ...second.data]).toEqual(['{"t":1}', '{"t":2}', '{"t":3}']);
    }
  });
});

describe('tokenGaps', () => {
  it('gives one gap per token after the first event', () => {
    expect(tokenGaps([{ at: 100, tokens: 1 }, { at: 110, tokens: 1 }, { at: 125, tokens: 1 }])).toEqual([10, 15]);
  });

  it('splits an event of n tokens into n equal gaps and skips empty events', () => {
    expect(tokenGaps([{ at: 0, tokens: 1 }, { at: 5, tokens: 0 }, { at: 20, tokens: 2 }, { at: 30, tokens: 1 }])).toEqual([10, 10, 10]);
  });

  it('has no gap for a stream of one event', () => {
    expect(tokenGaps([{ at: 3, tokens: 4 }])).toEqual([]);
    expect(tokenGaps([])).toEqual([]);
  });
});

describe('decodePhase', () => {
  it('counts the tokens after every stream has its first one, to the last token', () => {
    const a = [{ at: 10, tokens: 1 }, { at: 20, tokens: 1 }, { at: 30, tokens: 1 }, { at: 40, tokens: 1 }];
    const b = [{ at: 25, tokens: 1 }, { at: 35, tokens: 1 }, { at: 50, tokens: 2 }];
    // Starts at 25 (b's first token): a's 30 and 40, b's 35 and 50 (2 tokens) → 5 tokens over 25 ms.
    expect(decodePhase([a, b])).toEqual({ tokens: 5, ms: 25, tokensPerSecond: 200 });
  });

  it('is undefined when a stream has no token or nothing follows the last first token', () => {
    expect(decodePhase([[{ at: 1, tokens: 1 }], [{ at: 2, tokens: 0 }]])).toBeUndefined();
    expect(decodePhase([[{ at: 1, tokens: 1 }], [{ at: 2, tokens: 1 }]])).toBeUndefined();
    expect(decodePhase([])).toBeUndefined();
  });
});
