"""What the checking process of a sandbox job needs: a codec for plain data and a planner that
splits an ``assert`` test into the parts the completion must compute and the parts the checker
computes itself.

Why: the completion runs in its own process (harness.py), so nothing it does to its interpreter
(``__eq__`` that always holds, subclasses of int, patched builtins, edited harness modules) can
reach the checker. Only plain data crosses: ``decode`` builds exact built-in values (int, float,
complex, str, bytes, bool, None and list/tuple/dict/set/frozenset of them), so every comparison
runs on the checker's own objects. Standard library only; loaded by file path beside runner.py.
"""

from __future__ import annotations

import ast
import json
import os
import reprlib

MAX_DEPTH = 100
MAX_MESSAGE = 300
MAX_REPLY = 4 << 20  # bytes of one message between the two processes
PROBE = "__brorl_probe__"  # the name a planned test calls to get a value from the completion
_SMALL = 1 << 53  # larger ints travel as hex: str(int) refuses more than 4300 digits
_CHAIN = (ast.Attribute, ast.Subscript, ast.Call)


class NotPlainData(TypeError):
    """A value the tests would compare is not plain built-in data."""


class Tamper(BaseException):
    """The completion's process wrote something the protocol does not allow."""


class Gone(BaseException):
    """The completion's process ended (or closed its channel) before the checker was done."""


class Remote(Exception):
    """The chain raised in the completion's process (or its value was not plain data)."""

    def __init__(self, error: dict):
        super().__init__(error["message"])
        self.error = error


def describe(exc: BaseException) -> dict:
    """A short, JSON-safe account of an exception (the exception object itself is untrusted)."""
    out = {"type": "BaseException", "errno": None, "message": "", "filename": None}
    try:
        out["type"] = type(exc).__name__[:80]
        err = getattr(exc, "errno", None)
        out["errno"] = err if isinstance(err, int) else None
        fname = getattr(exc, "filename", None)
        out["filename"] = str(fname)[:200] if isinstance(fname, (str, bytes)) else None
        out["message"] = str(exc)[:MAX_MESSAGE]
    except BaseException:  # noqa: BLE001 - a hostile __str__ must not break reporting
        pass
    return out


def show(seen: list) -> str:
    """What the completion's chains gave, for a failed test's message: ``[(chain, value)]``."""
    parts = []
    for chain, value in seen[:5]:
        try:
            shown = reprlib.repr(value)
        except ValueError:  # an int too long for str(), somewhere inside
            shown = f"a {type(value).__name__} holding a very long int"
        parts.append(f"{chain[:80]} gave {shown}")
    return "; ".join(parts)[:MAX_MESSAGE]


def clean(error) -> dict:
    """An error record from the completion's process, cut back to what ``describe`` makes."""
    out = {"type": "BaseException", "errno": None, "message": "", "filename": None}
    if type(error) is dict:
        for key, size in (("type", 80), ("message", MAX_MESSAGE), ("filename", 200)):
            if type(error.get(key)) is str:
                out[key] = error[key][:size]
        if type(error.get("errno")) is int:
            out["errno"] = error["errno"]
    return out


class Channel:
    """JSON-object lines over a pair of pipes between the checker and the completion."""

    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd, self.buf = rfd, wfd, bytearray()

    def send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        if len(data) > MAX_REPLY:  # the checker would refuse it: say why instead
            raise NotPlainData(f"a value of more than {MAX_REPLY} bytes as JSON")
        while data:
            data = data[os.write(self.wfd, data) :]

    def recv(self) -> dict | None:
        """The next object; None at end of file; Tamper for anything else."""
        start = 0
        while (end := self.buf.find(b"\n", start)) < 0:
            if len(self.buf) > MAX_REPLY:
                raise Tamper(f"a message over {MAX_REPLY} bytes")
            start = len(self.buf)
            data = os.read(self.rfd, 1 << 16)
            if not data:
                return None
            self.buf += data
        line = bytes(self.buf[:end])
        del self.buf[: end + 1]
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            message = None
        if type(message) is not dict:
            raise Tamper("a line that is not a JSON object")
        return message


def _make_encoder():
    """Bind the real types and builtins now, before a completion could replace them. Types are
    compared by identity: a metaclass may define ``__eq__`` and ``__hash__`` too."""
    none, bool_, int_, float_, str_, bytes_, complex_ = (
        type(None),
        bool,
        int,
        float,
        str,
        bytes,
        complex,
    )
    list_, tuple_, dict_, set_, frozenset_ = list, tuple, dict, set, frozenset
    type_, hex_, getattr_, error = type, hex, getattr, NotPlainData

    def encode(value, depth: int = 0):
        kind = type_(value)
        if kind is none or kind is bool_ or kind is str_ or kind is float_:
            return value
        if kind is int_:
            return value if -_SMALL < value < _SMALL else ["i", hex_(value)]
        if depth >= MAX_DEPTH:
            raise error(f"plain data nested deeper than {MAX_DEPTH} levels")
        tag = (
            "l"
            if kind is list_
            else "t"
            if kind is tuple_
            else "s"
            if kind is set_
            else "f"
            if kind is frozenset_
            else ""
        )
        if tag:
            return [tag] + [encode(item, depth + 1) for item in value]
        if kind is dict_:
            out = ["d"]
            for key, item in value.items():
                out += [encode(key, depth + 1), encode(item, depth + 1)]
            return out
        if kind is bytes_:
            return ["b", value.hex()]
        if kind is complex_:
            return ["c", value.real, value.imag]
        name = getattr_(kind, "__name__", "?")
        raise error(
            f"got a {name if type_(name) is str_ else '?'}; tests compare only plain built-in "
            "data (int, float, complex, str, bytes, bool, None and list/tuple/dict/set/frozenset "
            "of them)"
        )

    return encode


encode = _make_encoder()


def decode(tree, depth: int = 0):
    """Rebuild a value from ``encode``'s tree with exact built-in types; ValueError otherwise."""
    kind = type(tree)
    if tree is None or kind is bool or kind is int or kind is float or kind is str:
        return tree
    if kind is not list or not tree or type(tree[0]) is not str or depth >= MAX_DEPTH:
        raise ValueError("not an encoded plain value")
    tag, rest = tree[0], tree[1:]
    try:
        if tag in ("l", "t", "s", "f"):
            items = [decode(item, depth + 1) for item in rest]
            return {"l": list, "t": tuple, "s": set, "f": frozenset}[tag](items)
        if tag == "d" and len(rest) % 2 == 0:
            values = [decode(item, depth + 1) for item in rest]
            return dict(zip(values[::2], values[1::2]))
        if tag == "i" and len(rest) == 1 and type(rest[0]) is str:
            return int(rest[0], 16)
        if tag == "b" and len(rest) == 1 and type(rest[0]) is str:
            return bytes.fromhex(rest[0])
        if tag == "c" and len(rest) == 2 and all(type(x) in (int, float) for x in rest):
            return complex(rest[0], rest[1])
    except TypeError as exc:  # an unhashable set member or dict key
        raise ValueError(f"not an encoded plain value ({exc})") from None
    raise ValueError(f"not an encoded plain value (tag {tag[:8]!r})")


def parse_test(source: str, index: int) -> ast.Assert:
    """The one ``assert`` statement a test must be; ValueError saying what to write otherwise."""
    try:
        body = ast.parse(source, f"<test {index}>").body
    except (SyntaxError, ValueError) as exc:
        raise ValueError(f"test {index} does not parse: {exc}") from None
    if len(body) != 1 or not isinstance(body[0], ast.Assert):
        raise ValueError(
            f"test {index} must be one assert statement, e.g. 'assert f(1) == 2' (put imports "
            "and helpers in 'setup')"
        )
    return body[0]


class Planner(ast.NodeTransformer):
    """Rewrite a test expression so that every chain rooted at a name the checker does not know
    (``f(1)``, ``Stack().pop()``, ``answer[0]``) becomes ``__brorl_probe__(k, {bound names})``.

    The chains (with their arguments) run in the completion's process and come back as plain
    data; everything around them — comparisons, arithmetic, builtins, setup helpers and the
    expected values — runs in the checker. The completion never sees the expected side.
    Names bound inside the test (comprehension targets, lambda parameters, ``:=``) are sent
    along as plain data when a chain uses them.
    """

    def __init__(self, known):
        self.known = known  # name -> bool: bound in the checker (setup or builtins)
        self.scopes: list[set[str]] = []
        self.chains: list[str] = []

    def plan(self, test: ast.expr) -> ast.Expression:
        walrus = {n.target.id for n in ast.walk(test) if isinstance(n, ast.NamedExpr)}
        self.scopes = [walrus]
        return ast.fix_missing_locations(ast.Expression(self.visit(test)))

    def visit(self, node):
        if isinstance(node, ast.expr) and self._theirs(node):
            return self._probe(node)
        return super().visit(node)

    def _bound(self) -> set[str]:
        return set().union(*self.scopes)

    def _theirs(self, node: ast.expr) -> bool:
        base = node
        while isinstance(base, _CHAIN):
            base = base.func if isinstance(base, ast.Call) else base.value
        return (
            isinstance(base, ast.Name)
            and isinstance(base.ctx, ast.Load)
            and base.id not in self._bound()
            and not self.known(base.id)
        )

    def _probe(self, node: ast.expr) -> ast.expr:
        bound = self._bound()
        names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in bound})
        self.chains.append(ast.unparse(node))
        call = ast.Call(
            func=ast.Name(PROBE, ast.Load()),
            args=[
                ast.Constant(len(self.chains) - 1),
                ast.Dict(
                    [ast.Constant(n) for n in names], [ast.Name(n, ast.Load()) for n in names]
                ),
            ],
            keywords=[],
        )
        return ast.copy_location(call, node)

    def _scoped(self, node, names: set[str]):
        self.scopes.append(names)
        try:
            return self.generic_visit(node)
        finally:
            self.scopes.pop()

    def _comprehension(self, node):
        names = {
            n.id for gen in node.generators for n in ast.walk(gen.target) if isinstance(n, ast.Name)
        }
        return self._scoped(node, names)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Lambda(self, node: ast.Lambda):
        a = node.args
        params = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]
        return self._scoped(node, {p.arg for p in params})
