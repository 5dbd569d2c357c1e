"""All pairs of hand-ins by their own code (grader.integrity.code), in time that grows with what
they share, not with the number of pairs.

An inverted index maps each winnowed fingerprint to the hand-ins that hold it; only pairs that
share a fingerprint are looked at, and for them the share is measured exactly. A k-gram held by
more than `common` hand-ins is what the class shares (the answers many converged on, MOSS's `-m`,
or a handout's code every student started from): it is common, and counts for no pair.

Each hand-in's own code is cut in two: its common code (tokens inside a common k-gram) and its
distinctive code (the rest: what the class does not share). A pair's shared part is the
distinctive tokens of each side inside a k-gram the other holds too; its share is measured
against that side's distinctive code, while the size reported stays the whole own code. So a
copy of a hand-in that is the handout's code and little else shares only a few distinctive
tokens (under MIN_TOKENS) and is not listed, however much text the two have in common, while a
copy of what a student wrote themselves shares all of it.

A pair is listed when it shares at least MIN_TOKENS distinctive tokens on each side and that is
at least MIN_SHARE of one side's distinctive code. Independent correct solutions share a line
here and there (one line is under K + WINDOW tokens, and the expected answers are the base's); a
copy shares runs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import combinations

from grader.integrity.code import K, OwnCode
from grader.results import ToDict

MIN_TOKENS = 40      # shared distinctive tokens, on each side, for a pair to be listed
MIN_SHARE = 0.5      # ... and at least this share of one side's distinctive code
STRONG_TOKENS = 80   # strong: this many shared tokens ...
STRONG_SHARE = 0.8   # ... making up this share of both sides' distinctive code


@dataclass
class CodeMatch(ToDict):
    """Two hand-ins' shared own code."""
    a: str
    b: str
    tokens_a: int              # distinctive tokens of a's own code in k-grams b holds too
    tokens_b: int
    size_a: int                # tokens of a's own code, its common code included
    size_b: int
    lines_a: list = field(default_factory=list)   # source lines of a holding shared tokens
    lines_b: list = field(default_factory=list)
    distinct_a: int = None     # tokens of a's distinctive code (its own code outside common k-grams)
    distinct_b: int = None

    @property
    def share_a(self) -> float:
        size = self.size_a if self.distinct_a is None else self.distinct_a
        return self.tokens_a / size if size else 0.0

    @property
    def share_b(self) -> float:
        size = self.size_b if self.distinct_b is None else self.distinct_b
        return self.tokens_b / size if size else 0.0

    @property
    def strong(self) -> bool:
        return min(self.tokens_a, self.tokens_b) >= STRONG_TOKENS and min(self.share_a, self.share_b) >= STRONG_SHARE


def _marks(own: OwnCode, kgrams: set) -> bytearray:
    """1 for each token of `own` inside a k-gram in `kgrams`."""
    marked = bytearray(own.size)
    for i, h in enumerate(own.kgrams):
        if h is not None and h in kgrams:
            marked[i:i + K] = b"\1" * K
    return marked


def _covered(own: OwnCode, shared: set, common: bytearray = None) -> tuple:
    """(tokens of `own` inside a k-gram in `shared` and outside its `common` marks, their source lines)."""
    marked = _marks(own, shared)
    if common is not None:
        marked = bytearray(m and not c for m, c in zip(marked, common))
    lines = sorted({own.lines[i] for i, m in enumerate(marked) if m})
    return sum(marked), lines


def similar_pairs(owns: dict, common: int) -> tuple:
    """([CodeMatch] listed, sorted by share), and the number of fingerprints taken as common.
    `owns` maps a key (the student) to its OwnCode; hand-ins without code are left out."""
    kgram_sets = {key: {h for h in own.kgrams if h is not None} for key, own in owns.items() if own and own.size}
    held = Counter(h for hs in kgram_sets.values() for h in hs)
    index = defaultdict(list)
    for key in kgram_sets:
        for fp in owns[key].fingerprints:
            if 2 <= held[fp] <= common:
                index[fp].append(key)
    candidates = Counter()
    for keys in index.values():
        candidates.update(combinations(sorted(keys), 2))
    classwide = {h for h, n in held.items() if n > common}
    marks = {key: _marks(owns[key], classwide) for key in {k for pair in candidates for k in pair}}
    matches = []
    for (a, b), _ in candidates.items():
        shared = {h for h in kgram_sets[a] & kgram_sets[b] if held[h] <= common}
        tokens_a, lines_a = _covered(owns[a], shared, marks[a])
        tokens_b, lines_b = _covered(owns[b], shared, marks[b])
        m = CodeMatch(a, b, tokens_a, tokens_b, owns[a].size, owns[b].size, lines_a, lines_b,
                      distinct_a=owns[a].size - sum(marks[a]), distinct_b=owns[b].size - sum(marks[b]))
        if min(tokens_a, tokens_b) >= MIN_TOKENS and max(m.share_a, m.share_b) >= MIN_SHARE:
            matches.append(m)
    matches.sort(key=lambda m: (-max(m.share_a, m.share_b), m.a, m.b))
    return matches, sum(1 for n in held.values() if n > common)
