"""Symbolic dims of the IR's JSON form: integers, or strings such as `batch*seq`, `past + seq`,
`hidden/4` (docs/ir.md). `evaluate_dim` computes one under bindings; `bind_dims` binds symbols from
declared types against actual shapes."""

import re

from . import errors

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(.))")


def _tokens(text):
    out = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise errors.WorkerError(errors.BAD_VALUE, "malformed dim '%s'" % text)
        num, name, sym = m.groups()
        if num is not None:
            out.append(("num", int(num)))
        elif name is not None:
            out.append(("name", name))
        elif sym is not None and sym.strip():
            out.append(("op", sym))
        pos = m.end()
    return out


# Dims parsed before (text -> tokens): a program's reshapes and slices evaluate the same few dims
# at every run (~600 a step of a 16-layer model), which tokenized each one again.
_PARSED = {}
_PARSED_MAX = 4096


def _tokens_of(text):
    toks = _PARSED.get(text)
    if toks is None:
        toks = tuple(_tokens(text))
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[text] = toks
    return toks


class _Parser:
    def __init__(self, text, env):
        self.text = text
        self.toks = _tokens_of(text)
        self.i = 0
        self.env = env

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self):
        t = self.peek()
        self.i += 1
        return t

    def fail(self, why):
        raise errors.WorkerError(errors.BAD_VALUE, "dim '%s': %s" % (self.text, why))

    def expr(self):
        v = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            r = self.term()
            v = v + r if op == "+" else v - r
        return v

    def term(self):
        v = self.atom()
        while self.peek() in (("op", "*"), ("op", "/")):
            op = self.take()[1]
            r = self.atom()
            if op == "*":
                v = v * r
            else:
                if r == 0 or v % r != 0:
                    self.fail("%d is not divisible by %d" % (v, r))
                v = v // r
        return v

    def atom(self):
        t = self.take()
        if t is None:
            self.fail("unexpected end")
        kind, val = t
        if kind == "num":
            return val
        if kind == "name":
            if val not in self.env:
                raise errors.WorkerError(errors.BAD_VALUE, "dim '%s': symbol '%s' is not bound" % (self.text, val))
            return self.env[val]
        if val == "(":
            v = self.expr()
            if self.take() != ("op", ")"):
                self.fail("missing ')'")
            return v
        if val == "-":
            return -self.atom()
        self.fail("unexpected '%s'" % val)
        return 0


def evaluate_dim(d, env):
    """The value of dim `d` (int or symbolic string) under `env` (symbol → int)."""
    if isinstance(d, int):
        return d
    if isinstance(d, str):
        v = env.get(d)
        if type(v) is int:
            return v  # a bound symbol
        p = _Parser(d, env)
        v = p.expr()
        if p.peek() is not None:
            p.fail("trailing input")
        return v
    raise errors.WorkerError(errors.BAD_VALUE, "dim %r is neither an integer nor a string" % (d,))


_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def bind_dims(entries, env=None):
    """Binds the symbols of declared shapes from actual shapes.

    `entries`: (name, declared shape list, actual shape tuple). Plain symbols bind first; compound
    dims are then checked (and a compound dim with one unbound symbol of coefficient one is solved,
    e.g. `past + seq` binds `past` once `seq` is known). Conflicts are `RT_BAD_VALUE`.
    """
    env = dict(env or {})
    for name, decl, shape in entries:
        if len(decl) != len(shape):
            raise errors.WorkerError(errors.BAD_VALUE, "'%s' has rank %d, declared rank %d" % (name, len(shape), len(decl)))
        for d, s in zip(decl, shape):
            if isinstance(d, str) and _SYMBOL.match(d.strip()):
                key = d.strip()
                if key in env and env[key] != s:
                    raise errors.WorkerError(errors.BAD_VALUE, "'%s': %s = %d, but %s = %d elsewhere" % (name, key, s, key, env[key]))
                env[key] = s
    pending = [(name, d, s) for name, decl, shape in entries for d, s in zip(decl, shape) if not (isinstance(d, str) and _SYMBOL.match(d.strip()))]
    for _ in range(3):
        left = []
        for name, d, s in pending:
            try:
                v = evaluate_dim(d, env)
            except errors.WorkerError:
                left.append((name, d, s))
                continue
            if v != s:
                raise errors.WorkerError(errors.BAD_VALUE, "'%s': dim %s = %d, got %d" % (name, d, v, s))
        solved = []
        for name, d, s in left:
            names = [t[1] for t in _tokens_of(d) if t[0] == "name" and t[1] not in env]
            if len(set(names)) != 1:
                continue
            sym = names[0]
            # Dims are polynomials; solve the linear case d(sym) = a*sym + b by two evaluations.
            b = evaluate_dim(d, dict(env, **{sym: 0}))
            a = evaluate_dim(d, dict(env, **{sym: 1})) - b
            if a == 0 or (s - b) % a != 0 or evaluate_dim(d, dict(env, **{sym: (s - b) // a})) != s:
                continue
            env[sym] = (s - b) // a
            solved.append(sym)
        pending = left
        if not solved:
            break
    return env
