"""What a hand-in wrote beyond the skeleton: its own statements as normalised tokens, fingerprinted.

The assignment is a large skeleton around a few TODO lines, and correct TODO lines converge, so
text similarity over whole files says nothing (every correct hand-in looks alike). Here a hand-in's code is
cut down to what its author wrote:

1. Its statements, normalised and in a canonical order (grader.integrity.canon, from the syntax
   tree; grader.integrity.tokens for code that does not parse): comments, docstrings, imports,
   annotations and layout dropped, every name the code defines written `V`, every number `N` and
   string `S`, and the statements of each block ordered so that moving independent lines, or
   functions, about changes nothing. Keywords, builtins, imported names (`torch`, `dist`,
   `create_batch`), the attributes of the APIs it calls (`.all_reduce`, `.grad`) and keyword
   arguments (`op=`) keep their names: calling another API is a change, renaming is not.
2. A statement whose normalised form is one of the base's (the skeleton, the reference solution
   and utils.py, and any file a course adds, such as its own handout's code) is dropped: the
   skeleton, renamed or not, and the expected answers contribute nothing. What is left is the
   hand-in's own code. Over a batch, a statement more than TEMPLATE_SHARE of the hand-ins (and at
   least TEMPLATE_MIN) hold as their own is what the class was given beyond the base
   (`class_template`): dropped too.
3. Its k-grams of K tokens are hashed (the base's k-grams removed again, as copydetect does with
   boilerplate) and winnowed (Schleimer, Wilkerson and Aiken, SIGMOD 2003): any run of
   K + WINDOW - 1 tokens two hand-ins share is certain to share a fingerprint.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from grader import kit
from grader.integrity import canon, tokens as toks

K = 10        # tokens per k-gram: shorter runs (one convergent line, `V = V . grad`) say nothing
WINDOW = 4    # winnowing window: every shared run of K + WINDOW - 1 = 13 tokens is found
TEMPLATE_SHARE = 0.25  # own statements more than a quarter of the class holds are what it was given ...
TEMPLATE_MIN = 3       # ... and at least this many (two hand-ins sharing everything may be a copy)
MAX_ALONE_LINES = 200   # a statement of a file that does not parse is read alone up to this long


@dataclass
class Parsed:
    """A file read once: its syntax tree (None: it does not parse, and is read by tokens), and the
    names its imports bind and the attributes it assigns."""
    text: str = ""
    tree: object = None
    statements: list = field(default_factory=list)   # token statements, where there is no tree
    imported: set = field(default_factory=set)
    attributes: set = field(default_factory=set)


def parse(text: str) -> Parsed:
    tree = canon.parse(text)
    if tree is not None:
        return Parsed(text, tree, [], *canon.prepare(tree))
    stmts, imported = toks.statements(text)
    return Parsed(text, None, stmts, imported, toks.assigned_attributes(stmts))


def units_of(parsed: Parsed, keep: set, attributes: set) -> list:
    """[(normalised tokens, their source lines)] of every statement that counts: canonical where
    the file parses; where it does not, in file order, each statement that parses on its own
    normalised as if the file did (`_alone`), the others token by token."""
    keep, attributes = keep | parsed.imported, attributes | parsed.attributes
    if parsed.tree is not None:
        found = canon.units(parsed.tree, keep, attributes, parsed.imported)
        if found is not None:
            return found
        parsed.statements = toks.statements(parsed.text)[0]
    lines = parsed.text.splitlines()
    return [n for s in parsed.statements for n in _alone(s, lines, keep, attributes, parsed.imported) if n[0]]


def _alone(stmt: list, lines: list, keep: set, attributes: set, imported: set) -> list:
    """The units of one statement of a file that does not parse: its source alone (a `:` given a
    body) read through its syntax tree where it parses, its tokens where it does not."""
    (row, col), (end_row, end_col) = stmt[0].start, stmt[-1].end
    if 0 < row <= end_row <= len(lines) and end_row - row < MAX_ALONE_LINES:
        segment = [lines[r - 1] for r in range(row, end_row + 1)]
        segment[-1], segment[0] = segment[-1][:end_col], segment[0][col:] if row < end_row else segment[0][col:end_col]
        text = "\n".join(segment) + ("\n    pass\n" if stmt[-1].string == ":" else "\n")
        tree = canon.parse(text)
        if tree is not None and len(tree.body) == 1:
            canon.prepare(tree)
            found = canon.units(tree, keep, attributes, imported)
            if found is not None:
                return [(tokens, [row] * len(tokens)) for tokens, _ in found]
    return [toks.normalise(stmt, keep, attributes)]


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
    solution and utils.py (and any file a course adds), as normalised statements and as k-grams."""
    statements: set = field(default_factory=set)
    kgrams: set = field(default_factory=set)
    keep: set = field(default_factory=set)         # names that keep their spelling
    attributes: set = field(default_factory=set)   # attribute names the base assigns
    files: list = field(default_factory=list)      # the files it was made from
    lines: set = field(default_factory=set)        # every line of them, stripped (comments too)

    @classmethod
    def from_files(cls, paths=(kit.SKELETON, kit.REFERENCE, kit.UTILS), extra=()) -> "Base":
        """The base made of `paths` and `extra` (a file of `paths` that is not there is left out:
        the reference is only in the instructors' tree; every file of `extra` must be there)."""
        texts = {Path(p): Path(p).read_text(errors="replace") for p in paths if Path(p).is_file()}
        texts |= {Path(p): Path(p).read_text(errors="replace") for p in extra}
        base = cls(files=[str(p.relative_to(kit.ASSIGNMENT)) if kit.ASSIGNMENT in p.parents else str(p)
                          for p in texts])
        base.lines = {line.strip() for t in texts.values() for line in t.splitlines()} - {""}
        parsed = [parse(t) for t in texts.values()]
        base.keep = set(toks.KEEP).union(*(p.imported for p in parsed))
        base.attributes = set().union(*(p.attributes for p in parsed))
        for p in parsed:
            normal = [tokens for tokens, _ in units_of(p, base.keep, base.attributes)]
            base.statements.update(normal)
            base.kgrams.update(kgram_hashes([t for n in normal for t in n]))
        return base


@dataclass
class OwnCode:
    """A hand-in's own code: its normalised tokens beyond the base, and where they come from."""
    tokens: list = field(default_factory=list)    # normalised, in the canonical order
    lines: list = field(default_factory=list)     # the source line of each token
    kgrams: list = field(default_factory=list)    # hash of the k-gram starting at each token; None: the base's
    fingerprints: set = field(default_factory=set)   # winnowed, the base's left out
    units: list = field(default_factory=list)     # its own statements: (normalised tokens, their lines)

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def statements(self) -> int:
        return len(self.units)


def own_lines(text: str, base: Base) -> int:
    """The lines of `text`, comments included, that no file of `base` has (blank lines aside): 0 for
    the skeleton with the expected answers typed in, however it was written."""
    return sum(1 for line in {line.strip() for line in text.splitlines()} - {""} if line not in base.lines)


def from_units(units: list, base: Base) -> OwnCode:
    """The own code made of `units`, its k-grams (the base's marked None) and fingerprints."""
    own = OwnCode(units=units)
    for tokens, lines in units:
        own.tokens += tokens
        own.lines += lines
    own.kgrams = [None if h in base.kgrams else h for h in kgram_hashes(own.tokens)]
    own.fingerprints = winnow([h for h in own.kgrams if h is not None])
    return own


def own_code(text: str, base: Base) -> OwnCode:
    """`text`'s own code beyond `base` (see the module docstring)."""
    return from_units([(tokens, lines) for tokens, lines in units_of(parse(text), base.keep, base.attributes)
                       if tokens not in base.statements], base)


def class_template(owns: list, share: float = TEMPLATE_SHARE) -> set:
    """The own statements that more than `share` of `owns` hold (and at least TEMPLATE_MIN): the
    code a class was given beyond the base (a course's own handout, say), which every hand-in
    holds and none wrote. A copy is held by two."""
    held = Counter(tokens for own in owns for tokens in {t for t, _ in own.units})
    least = max(TEMPLATE_MIN, math.floor(share * len(owns)) + 1)
    return {tokens for tokens, n in held.items() if n >= least}


def without(own: OwnCode, statements: set, base: Base) -> OwnCode:
    """`own` without `statements` (class_template's)."""
    if not statements or not any(t in statements for t, _ in own.units):
        return own
    return from_units([(t, lines) for t, lines in own.units if t not in statements], base)
