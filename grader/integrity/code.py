"""What a hand-in wrote beyond the skeleton: its own statements as normalised tokens, fingerprinted.

The assignment is a large skeleton around a few TODO lines, and correct TODO lines converge, so
text similarity over whole files says nothing (every correct hand-in looks alike). Here a hand-in's code is
cut down to what its author wrote:

1. Python's own `tokenize` splits it into statements (logical lines, split again at `;`);
   comments, docstrings and import statements are dropped.
2. Each statement is normalised: every name the code defines (variables, parameters, functions,
   classes, attributes it assigns) becomes `V`, numbers `N`, strings `S`. Keywords, builtins,
   imported names (`torch`, `dist`, `create_batch`), the attributes of the APIs it calls
   (`.all_reduce`, `.grad`) and keyword arguments (`op=`) keep their names: renaming variables or
   deleting comments changes nothing, while calling another API does.
3. A statement whose normalised form is one of the base's (the skeleton, the reference solution
   and utils.py) is dropped: the skeleton, renamed or not, and the expected answers contribute
   nothing. What is left, in file order, is the hand-in's own code.
4. Its k-grams of K tokens are hashed (the base's k-grams removed again, as copydetect does with
   boilerplate) and winnowed (Schleimer, Wilkerson and Aiken, SIGMOD 2003): any run of
   K + WINDOW - 1 tokens two hand-ins share is certain to share a fingerprint.
"""

from __future__ import annotations

import builtins
import hashlib
import keyword
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from grader import kit

K = 10        # tokens per k-gram: shorter runs (one convergent line, `V = V . grad`) say nothing
WINDOW = 4    # winnowing window: every shared run of K + WINDOW - 1 = 13 tokens is found
KEEP = frozenset(dir(builtins)) | frozenset(keyword.kwlist) | {"self", "cls"}
ASSIGN = frozenset({"=", "+=", "-=", "*=", "/=", "//=", "%=", "**=", "@=", "&=", "|=", "^=", ">>=", "<<=", ":="})
SKIP = frozenset({tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
                  tokenize.ENDMARKER})
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
                found.append(tok._replace(start=(tok.start[0] + start, tok.start[1])))
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


def _split(text: str) -> list:
    """Every statement of `text` as a list of its tokens: logical lines, split again at `;`."""
    out, current, depth = [], [], 0
    for tok in _tokens(text):
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
    is not an import and not a docstring (a statement that is only strings)."""
    counted, imported = [], set()
    for stmt in _split(text):
        if _is_import(stmt):
            imported |= _bound_by_import(stmt)
        elif not all(t.type == tokenize.STRING for t in stmt):
            counted.append(stmt)
    return counted, imported


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


def kgram_hashes(tokens: list) -> list:
    """The hash of every k-gram of `tokens`, as 64-bit ints (the same in every process)."""
    return [int.from_bytes(hashlib.blake2b("\x1f".join(tokens[i:i + K]).encode(), digest_size=8).digest(), "big")
            for i in range(len(tokens) - K + 1)]


def winnow(hashes: list, window: int = WINDOW) -> set:
    """Robust winnowing: the smallest hash of every `window` consecutive hashes, the rightmost on ties."""
    if len(hashes) <= window:
        return {min(hashes)} if hashes else set()
    chosen, last = set(), -1
    for start in range(len(hashes) - window + 1):
        pick = min(range(start, start + window), key=lambda i: (hashes[i], -i))
        if pick != last:
            chosen.add(hashes[pick])
            last = pick
    return chosen


@dataclass
class Base:
    """What every hand-in may hold without it meaning anything: the skeleton, the reference
    solution and utils.py, as normalised statements and as k-grams."""
    statements: set = field(default_factory=set)
    kgrams: set = field(default_factory=set)
    keep: set = field(default_factory=set)         # names that keep their spelling
    attributes: set = field(default_factory=set)   # attribute names the base assigns
    files: list = field(default_factory=list)      # the files it was made from

    @classmethod
    def from_files(cls, paths=(kit.SKELETON, kit.REFERENCE, kit.UTILS)) -> "Base":
        """The base made of `paths` (a file that is not there is left out: the reference is only in
        the instructors' tree)."""
        texts = {Path(p): Path(p).read_text(errors="replace") for p in paths if Path(p).is_file()}
        base = cls(files=[str(p.relative_to(kit.ASSIGNMENT)) if kit.ASSIGNMENT in p.parents else p.name
                          for p in texts])
        parsed = [statements(t) for t in texts.values()]
        base.keep = set(KEEP).union(*(imported for _, imported in parsed))
        base.attributes = set().union(*(assigned_attributes(stmts) for stmts, _ in parsed))
        for stmts, _ in parsed:
            normal = [normalise(s, base.keep, base.attributes)[0] for s in stmts]
            base.statements.update(normal)
            base.kgrams.update(kgram_hashes([t for n in normal for t in n]))
        return base


@dataclass
class OwnCode:
    """A hand-in's own code: its normalised tokens beyond the base, and where they come from."""
    tokens: list = field(default_factory=list)    # normalised, in file order
    lines: list = field(default_factory=list)     # the source line of each token
    kgrams: list = field(default_factory=list)    # hash of the k-gram starting at each token; None: the base's
    fingerprints: set = field(default_factory=set)   # winnowed, the base's left out
    statements: int = 0                           # own statements

    @property
    def size(self) -> int:
        return len(self.tokens)


def own_code(text: str, base: Base) -> OwnCode:
    """`text`'s own code beyond `base` (see the module docstring)."""
    stmts, imported = statements(text)
    keep = base.keep | imported
    attributes = base.attributes | assigned_attributes(stmts)
    own = OwnCode()
    for stmt in stmts:
        tokens, lines = normalise(stmt, keep, attributes)
        if tokens and tokens not in base.statements:
            own.statements += 1
            own.tokens += tokens
            own.lines += lines
    own.kgrams = [None if h in base.kgrams else h for h in kgram_hashes(own.tokens)]
    own.fingerprints = winnow([h for h in own.kgrams if h is not None])
    return own
