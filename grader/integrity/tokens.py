"""A hand-in's code as normalised tokens: what renaming, comments and layout cannot change.

Python's own `tokenize` reads the code; comments, docstrings and import statements are dropped
(`statements`). Each statement is normalised (`normalise`): every name the code defines
(variables, parameters, functions, classes, attributes it assigns) becomes `V`, numbers `N`,
strings `S`. Keywords, builtins, imported names (`torch`, `dist`, `create_batch`), the attributes
of the APIs it calls (`.all_reduce`, `.grad`) and keyword arguments (`op=`) keep their names:
renaming variables or deleting comments changes nothing, while calling another API does. What
formatters change (a trailing comma, parentheses around a tuple) is undone.

Code that does not tokenise is read statement by statement around the broken ones (`_tokens`);
grader.integrity.canon reads code that parses through its syntax tree instead, and hands each
statement here to be normalised.
"""

from __future__ import annotations

import builtins
import keyword
import tokenize

KEEP = frozenset(dir(builtins)) | frozenset(keyword.kwlist)   # `self` is a name like any: a helper may call it `layer`
ASSIGN = frozenset({"=", "+=", "-=", "*=", "/=", "//=", "%=", "**=", "@=", "&=", "|=", "^=", ">>=", "<<=", ":="})
SKIP = frozenset({tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
                  tokenize.ENDMARKER})
# Statements whose `:` opens a block (or a lambda's body), never an annotation.
BLOCK_WORDS = frozenset({"def", "async", "class", "if", "elif", "else", "for", "while", "with", "try", "except",
                         "finally", "lambda", "match", "case"})
RESTARTS = 20  # tokenising starts again after a broken statement this many times at most
FSTRING_START = getattr(tokenize, "FSTRING_START", None)   # Python 3.12 splits f-strings into tokens
FSTRING_END = getattr(tokenize, "FSTRING_END", None)


def _tokens(text: str) -> list:
    """Every token of `text`. Code that does not tokenise (an unclosed bracket or string, a bad
    indent) is cut at the broken statement's first line and tokenised again after it, so a broken
    line cannot swallow the rest of the file into one statement; after RESTARTS breaks, the rest
    of the file is left out (each restart reads the rest of the file: no file may cost more)."""
    lines = text.splitlines(keepends=True)
    found, start = [], 0
    for _ in range(RESTARTS):
        if start >= len(lines):
            break
        chunk, mark = iter(lines[start:]), len(found)
        try:
            for tok in tokenize.generate_tokens(lambda: next(chunk, "")):
                found.append(tok._replace(start=(tok.start[0] + start, tok.start[1]),
                                          end=(tok.end[0] + start, tok.end[1])))
            break
        except (tokenize.TokenError, SyntaxError) as e:   # IndentationError is a SyntaxError
            cut = len(found)
            while cut > mark and found[cut - 1].type not in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                cut -= 1
            if cut < len(found):   # a statement in progress: keep its first line only
                first = found[cut].start[0]
                found[cut:] = [t for t in found[cut:] if t.start[0] == first]
                found.append(tokenize.TokenInfo(tokenize.NEWLINE, "\n", (first, 0), (first, 0), ""))
                start = max(first, start + 1)
            else:                  # between statements (a bad indent): start again at its line
                where = e.lineno if isinstance(e, SyntaxError) else (e.args[1][0] if len(e.args) > 1 else 1)
                start = max(start + (where or 1) - 1, start + 1)
    return found


def split(tokens) -> list:
    """Every statement of `tokens` as a list of its tokens: logical lines, split again at `;`."""
    out, current, depth = [], [], 0
    for tok in tokens:
        if tok.type in SKIP:
            continue
        if tok.type == tokenize.OP and tok.string in ("(", "[", "{"):
            depth += 1
        elif tok.type == tokenize.OP and tok.string in (")", "]", "}"):
            depth = max(depth - 1, 0)
        ends = tok.type == tokenize.NEWLINE or (tok.type == tokenize.OP and tok.string == ";" and depth == 0)
        if not ends:
            current.append(tok)
            continue
        if current:
            out.append(current)
        current = []
        if tok.type == tokenize.NEWLINE:
            depth = 0
    if current:
        out.append(current)
    return out


def _is_import(stmt) -> bool:
    return stmt[0].string == "import" or (stmt[0].string == "from" and any(t.string == "import" for t in stmt))


def statements(text: str) -> tuple:
    """(the statements of `text` that count, the names its imports bind). A statement that counts
    is not an import, not `pass` and not a docstring or other bare constant; annotations are
    dropped and `elif c:` is `else:` and `if c:`, as grader.integrity.canon reads code that parses."""
    counted, imported = [], set()
    for stmt in split(_tokens(text)):
        if _is_import(stmt):
            imported |= _bound_by_import(stmt)
        elif not all(t.type in (tokenize.STRING, tokenize.NUMBER) or t.string in ("pass", "...") for t in stmt):
            stmt = _unannotated(stmt)
            if stmt and stmt[0].string == "elif":
                counted.append([stmt[0]._replace(string="else"), stmt[-1]])
                stmt = [stmt[0]._replace(string="if")] + stmt[1:]
            if stmt:
                counted.append(stmt)
    return counted, imported


def _depths(stmt) -> list:
    """The bracket depth at each token of `stmt` (an opening bracket is inside what it opens)."""
    depths, depth = [], 0
    for t in stmt:
        depth += t.string in ("(", "[", "{") and t.type == tokenize.OP
        depths.append(depth)
        depth -= t.string in (")", "]", "}") and t.type == tokenize.OP
    return depths


def _unannotated(stmt) -> list:
    """`stmt` without annotations: `def f(a: T = 1) -> R:` is `def f(a = 1):`, `x: T = v` is
    `x = v`, and a bare `x: T` is nothing."""
    words, depths = [t.string for t in stmt], _depths(stmt)
    if words[0] in ("def", "async") and "(" in words:
        opened = words.index("(")
        closed = next((i for i in range(opened + 1, len(words)) if words[i] == ")" and depths[i] == 1), len(words) - 1)
        dropped, start = set(), opened + 1
        for end in [i for i in range(start, closed) if words[i] == "," and depths[i] == 1] + [closed]:
            top = [i for i in range(start, end) if depths[i] == 1]
            colon = next((i for i in top if words[i] in (":", "=")), None)
            if colon is not None and words[colon] == ":":
                stop = next((i for i in top if i > colon and words[i] == "="), end)
                dropped |= set(range(colon, stop))
            start = end + 1
        if closed + 1 < len(words) and words[closed + 1] == "->":
            dropped |= set(range(closed + 1, len(words) - 1))
        return [t for i, t in enumerate(stmt) if i not in dropped]
    colon = next((i for i, (w, d) in enumerate(zip(words, depths)) if w == ":" and d == 0), None)
    if colon is None or words[0] in BLOCK_WORDS:
        return stmt
    equals = next((i for i in range(colon, len(words)) if words[i] == "=" and depths[i] == 0), None)
    return [] if equals is None else stmt[:colon] + stmt[equals:]


def _bound_by_import(stmt) -> set:
    """`import a.b as c, d` binds c and d; `from m import x as y, z` binds y and z."""
    words = [t.string for t in stmt]
    names = words[words.index("import") + 1:] if "import" in words else []
    bound, i = set(), 0
    while i < len(names):
        if names[i] in ("(", ")", ",", "*"):
            i += 1
            continue
        j = i
        while j + 2 < len(names) and names[j + 1] == ".":
            j += 2
        if j + 2 < len(names) and names[j + 1] == "as":
            bound.add(names[j + 2])
            i = j + 3
        else:
            bound.add(names[i])
            i = j + 1
    return bound


def assigned_attributes(stmts: list) -> set:
    """Attribute names the code assigns (`self.W = ...`) or defines as methods: the code's own
    names, like its variables."""
    found = set()
    for stmt in stmts:
        for i in range(1, len(stmt) - 1):
            if stmt[i - 1].string == "." and stmt[i].type == tokenize.NAME and stmt[i + 1].string in ASSIGN:
                found.add(stmt[i].string)
        if stmt[0].string in ("def", "class") and len(stmt) > 1:
            found.add(stmt[1].string)
    return found


def _unwrapped(stmt: list) -> list:
    """`stmt` without the parentheses around a tuple it assigns to: `(a, b) = x` is `a, b = x`, and
    `for (a, b) in x:` is `for a, b in x:` (formatters differ on them: Python 3.10's ast.unparse
    writes them, later ones do not)."""
    start, after = (1, "in") if stmt and stmt[0].string == "for" else (0, "=")
    if len(stmt) <= start or stmt[start].string != "(":
        return stmt
    depth = 0
    for j in range(start, len(stmt)):
        depth += stmt[j].string in ("(", "[", "{")
        depth -= stmt[j].string in (")", "]", "}")
        if depth == 0:
            if j + 1 < len(stmt) and stmt[j + 1].string == after and stmt[j + 1].type in (tokenize.OP, tokenize.NAME):
                return stmt[:start] + stmt[start + 1:j] + stmt[j + 1:]
            return stmt
    return stmt


def normalise(stmt, keep: set, attributes: set) -> tuple:
    """(tokens, lines): a statement's tokens with the code's own names as V, numbers as N and strings
    as S (see the module docstring), and the source line of each."""
    stmt = _unwrapped(stmt)
    tokens, lines, depth, in_fstring = [], [], 0, 0
    is_def = stmt[0].string in ("def", "class", "async", "lambda")
    for i, tok in enumerate(stmt):
        kind, text = tok.type, tok.string
        if FSTRING_START is not None and kind == FSTRING_START:
            in_fstring += 1
            if in_fstring == 1:
                tokens.append("S")
                lines.append(tok.start[0])
            continue
        if in_fstring:
            in_fstring -= kind == FSTRING_END
            continue
        if kind == tokenize.NAME:
            before = stmt[i - 1].string if i else ""
            after = stmt[i + 1].string if i + 1 < len(stmt) else ""
            if before == ".":
                word = "V" if text in attributes else text    # an API's attribute keeps its name
            elif text in keep:
                word = text
            elif depth and after == "=" and not is_def:
                word = text                                   # a keyword argument names a parameter
            else:
                word = "V"
        elif kind == tokenize.NUMBER:
            word = "N"
        elif kind == tokenize.STRING:
            if tokens and tokens[-1] == "S":   # "a" "b" is one string
                continue
            word = "S"
        elif kind == tokenize.OP:
            if text in ("(", "[", "{"):
                depth += 1
            elif text in (")", "]", "}"):
                depth = max(depth - 1, 0)
            word = text
        elif text.strip():
            word = text.strip()   # an ERRORTOKEN: a stray character of code that does not parse
        else:
            continue
        tokens.append(word)
        lines.append(tok.start[0])
    return _layout_free(tokens, lines)


def _layout_free(tokens: list, lines: list) -> tuple:
    """What formatters change, undone: a trailing comma before a closing bracket, and the
    parentheses around a tuple that is the whole value of `=`, `return` or `yield`."""
    keep = [i for i in range(len(tokens)) if not (tokens[i] == "," and i + 1 < len(tokens)
                                                  and tokens[i + 1] in (")", "]", "}"))]
    tokens, lines = [tokens[i] for i in keep], [lines[i] for i in keep]
    for i in range(1, len(tokens)):
        if tokens[i] == "(" and tokens[i - 1] in ("=", "return", "yield") and tokens[-1] == ")":
            depth, comma, closes = 0, False, None
            for j in range(i, len(tokens)):
                depth += (tokens[j] in ("(", "[", "{")) - (tokens[j] in (")", "]", "}"))
                comma |= depth == 1 and tokens[j] == ","
                if depth == 0:
                    closes = j
                    break
            if closes == len(tokens) - 1 and comma:
                tokens, lines = tokens[:i] + tokens[i + 1:-1], lines[:i] + lines[i + 1:-1]
            break
    return tuple(tokens), lines
