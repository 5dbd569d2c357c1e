"""A hand-in's statements in a canonical order, from its syntax tree: what reordering independent
lines, reformatting, moving functions about and type hints cannot change.

Python's `ast` parses the code, and every block (the module, a class or function body, a loop's
or a branch's body) is read statement by statement:

- docstrings and other bare constants, `pass` and imports are dropped, and so are annotations
  (`x: int = 1` is `x = 1`, `def f(a: T) -> T` is `def f(a)`); an f-string is the expressions
  it prints (`f"{a} and {b}"` is `"..." % (a, b)`);
- a statement is written out again by `ast.unparse`, which lays it out one way whatever its
  source looked like (parentheses, line breaks, quotes, trailing commas), and normalised by
  grader.integrity.tokens (names, numbers and strings); a compound statement (`def`, `class`,
  `for`, `if`, `with`, `try`, `match`) is its header line followed by its blocks;
- the statements of a block are put in a canonical order: a statement that reads or writes a
  name an earlier one writes, or writes a name an earlier one reads, stays after it, and so does
  everything after a `return`, `raise`, `break`, `yield` ... (a barrier); of the statements free
  to come next, the one whose normalised tokens sort first comes first (Kahn's algorithm). A
  method call may change its object (`opt.step()` writes `opt`), and a call standing alone may
  change what it is given (`dist.all_reduce(p.grad)` writes `p`). Two blocks that differ only in
  the order of statements that touch none of each other's names, or of the functions and classes
  of a module, come out the same.

`units` returns None for code that does not parse (or nests too deep to walk): the caller reads
it with grader.integrity.tokens instead, in file order.
"""

from __future__ import annotations

import ast
import copy
import heapq
import io
import tokenize
from dataclasses import dataclass, field

from grader import outline
from grader.integrity.tokens import normalise, split

MAX_BLOCK = 300    # statements: a longer block keeps its order (ordering it costs its square)
BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")
BARRIERS = (ast.Return, ast.Raise, ast.Break, ast.Continue, ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom,
            ast.Await)
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def parse(text: str):
    """The syntax tree of `text`, or None when it does not parse (grader.outline.tree: parsed on a
    deep stack, so that no code, held to the size caps, can end the process by nesting)."""
    return outline.tree(text)


def _fstring(node):
    """An f-string as the expressions it prints, `"" % (a, b)` (nested f-strings too)."""
    values = [_fstring(v.value) if isinstance(v.value, ast.JoinedStr) else v.value
              for v in node.values if isinstance(v, ast.FormattedValue)]
    plain = ast.BinOp(ast.Constant(""), ast.Mod(), ast.Tuple(values, ast.Load())) if values else ast.Constant("")
    return ast.copy_location(plain, node)


def _compared(node):
    """`node` as it is compared: an AnnAssign as an Assign (or `pass`, without a value), an
    f-string as `_fstring` has it."""
    if isinstance(node, ast.JoinedStr):
        return _fstring(node)
    if isinstance(node, ast.AnnAssign):
        plain = ast.Assign(targets=[node.target], value=node.value) if node.value is not None else ast.Pass()
        return ast.copy_location(plain, node)
    return node


def prepare(tree) -> tuple:
    """Strip `tree` of what is never compared (annotations; f-strings become their expressions, see
    `_compared`), in one walk, and return (names its imports bind, attribute names it assigns or
    defines): `import a.b as c` binds c, `import a.b` binds a; `self.W = ...` assigns W, and a
    `def`'s or `class`'s name is the code's own too (methods are reached as attributes)."""
    imported, attributes = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported |= {a.asname or a.name for a in node.names if a.name != "*"}
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            attributes.add(node.attr)
        elif isinstance(node, DEFINITIONS):
            attributes.add(node.name)
            if not isinstance(node, ast.ClassDef):
                node.returns = None
        elif isinstance(node, ast.arg):
            node.annotation = None
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):
                value[:] = [_compared(v) for v in value]
            elif isinstance(value, (ast.JoinedStr, ast.AnnAssign)):
                setattr(node, name, _compared(value))
    return imported, attributes


def _dropped(node) -> bool:
    return isinstance(node, (ast.Import, ast.ImportFrom, ast.Pass)) or (
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))


def _root(node):
    """The name an attribute or subscript chain starts from (`a` of `a.b[c].d`), or None."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


@dataclass
class _Effects:
    reads: set = field(default_factory=set)
    writes: set = field(default_factory=set)
    barrier: bool = False

    def before(self, later: "_Effects") -> bool:
        """Whether a statement with these effects must stay before one with `later`'s."""
        return (self.barrier or later.barrier or bool(self.writes & (later.reads | later.writes))
                or bool(self.reads & later.writes))

    def add(self, other: "_Effects") -> None:
        self.reads |= other.reads
        self.writes |= other.writes
        self.barrier |= other.barrier


def _effects(nodes, imported: set, found: _Effects = None) -> _Effects:
    """The names `nodes` (a statement without its blocks, or expressions) read and write (see the
    module docstring); the bodies of functions and lambdas run later, and count for nothing here."""
    found = found or _Effects()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, BARRIERS):
            found.barrier = True
        if isinstance(node, ast.Name):
            (found.reads if isinstance(node.ctx, ast.Load) else found.writes).add(node.id)
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and not isinstance(node.ctx, ast.Load):
            found.writes |= {_root(node)} - {None}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            found.writes |= {_root(node.func.value)} - {None} - imported
        stack.extend(ast.iter_child_nodes(node))
    return found


def _header_effects(node, imported: set) -> _Effects:
    """The effects of a statement's own line: a definition binds its name (its decorators, defaults
    and bases run now, its body later); a call standing alone may change what it is given."""
    if isinstance(node, DEFINITIONS):
        found = _Effects(writes={node.name})
        parts = node.decorator_list + (node.bases + [k.value for k in node.keywords] if isinstance(node, ast.ClassDef)
                                       else node.args.defaults + [d for d in node.args.kw_defaults if d])
        return _effects(parts, imported, found)
    found = _Effects(barrier=isinstance(node, BARRIERS))
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        call = node.value
        found.writes |= {_root(a) for a in [*call.args, *(k.value for k in call.keywords)]} - {None} - imported
    fields = [v for name, v in ast.iter_fields(node) if name not in BLOCKS]
    parts = [x for v in fields for x in (v if isinstance(v, list) else [v]) if isinstance(x, ast.AST)]
    if isinstance(node, ast.ExceptHandler) and node.name:
        found.writes.add(node.name)
    return _effects(parts, imported, found)


@dataclass
class _Item:
    key: tuple      # its normalised tokens, all of them: the order among free statements
    units: list     # [(tokens, lines)]
    effects: _Effects


def _order(items: list) -> list:
    """`items` in the canonical order (see the module docstring)."""
    if len(items) > MAX_BLOCK:
        return items
    after, waiting = [[] for _ in items], [0] * len(items)
    for j, later in enumerate(items):
        for i in range(j):
            if items[i].effects.before(later.effects):
                after[i].append(j)
                waiting[j] += 1
    ready = [(item.key, i) for i, item in enumerate(items) if not waiting[i]]
    heapq.heapify(ready)
    ordered = []
    while ready:
        _, i = heapq.heappop(ready)
        ordered.append(items[i])
        for j in after[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, (items[j].key, j))
    return ordered


class _Reader:
    """Reads one syntax tree into units, with the names that keep their spelling."""

    def __init__(self, keep: set, attributes: set, imported: set):
        self.keep, self.attributes, self.imported = keep, attributes, imported

    def _normalised(self, text: str, line: int) -> list:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        return [(n[0], [line] * len(n[0])) for n in (normalise(s, self.keep, self.attributes) for s in split(tokens))
                if n[0]]

    def _header(self, node) -> list:
        """The units of a compound statement's header: its decorators and its `... :` line."""
        clone = copy.copy(node)
        for name in BLOCKS:
            if hasattr(clone, name):
                setattr(clone, name, [ast.Pass()] if name == "body" else [])
        units = self._normalised(ast.unparse(clone), node.lineno)
        while units and units[-1][0][-1] != ":":   # the placeholder `pass`
            units.pop()
        return units

    def block(self, body: list) -> tuple:
        """(the units of a block's statements in the canonical order, their effects together)."""
        items, together = [], _Effects()
        for node in body:
            if _dropped(node):
                continue
            units, effects = self.statement(node)
            together.add(effects)
            if units:
                items.append(_Item(tuple(t for tokens, _ in units for t in tokens), units, effects))
        return [unit for item in _order(items) for unit in item.units], together

    def statement(self, node) -> tuple:
        """(the units of a statement, its effects: its own line's and, but for a definition, its blocks')."""
        effects = _header_effects(node, self.imported)
        if not any(isinstance(getattr(node, name, None), list) for name in BLOCKS):
            return self._normalised(ast.unparse(node), node.lineno), effects
        inner = _Effects()
        units = self._header(node) + self._block_into(getattr(node, "body", []), inner)
        for sub in [*getattr(node, "handlers", []), *getattr(node, "cases", [])]:
            inner.add(_header_effects(sub, self.imported))
            units += self._header(sub) + self._block_into(sub.body, inner)
        for name, word in (("orelse", "else"), ("finalbody", "finally")):
            if getattr(node, name, None):
                units += [((word, ":"), [getattr(node, name)[0].lineno] * 2)] + self._block_into(getattr(node, name),
                                                                                               inner)
        if not isinstance(node, DEFINITIONS):
            effects.add(inner)
        return units, effects

    def _block_into(self, body: list, effects: _Effects) -> list:
        units, together = self.block(body)
        effects.add(together)
        return units


def units(tree, keep: set, attributes: set, imported: set) -> list:
    """[(normalised tokens, their source lines)] of every statement of `tree` that counts, block by
    block in the canonical order; None when the tree is too deep to walk (read the code by tokens).
    `tree` is one `prepare` has read."""
    try:
        return _Reader(keep, attributes, imported).block(tree.body)[0]
    except (RecursionError, ValueError, tokenize.TokenError, SyntaxError):
        return None
