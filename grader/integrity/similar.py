"""All pairs of hand-ins by their own code (grader.integrity.code), in time that grows with what
they share, not with the number of pairs.

An inverted index maps each winnowed fingerprint to the hand-ins that hold it; only pairs that
share a fingerprint are looked at, and for them the share is measured exactly: the tokens of each
hand-in's own code that lie in a k-gram the other holds too. A k-gram held by more than `common`
hand-ins is an answer many converged on (MOSS's `-m`), and counts for no pair.

A pair is listed when it shares at least MIN_TOKENS tokens and that is at least MIN_SHARE of one
of the two hand-ins' own code. Independent correct solutions share a line here and there (one
line is under K + WINDOW tokens, and the expected answers are the base's); a copy shares runs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import combinations

from grader.integrity.code import K, OwnCode
from grader.results import ToDict

MIN_TOKENS = 40      # shared normalised tokens, on each side, for a pair to be listed
MIN_SHARE = 0.5      # ... and at least this share of one side's own code
STRONG_TOKENS = 80   # strong: this many shared tokens ...
STRONG_SHARE = 0.8   # ... making up this share of both sides' own code


@dataclass
class CodeMatch(ToDict):
    """Two hand-ins' shared own code."""
    a: str
    b: str
    tokens_a: int              # tokens of a's own code in k-grams b holds too
    tokens_b: int
    size_a: int                # tokens of a's own code
    size_b: int
    lines_a: list = field(default_factory=list)   # source lines of a holding shared tokens
    lines_b: list = field(default_factory=list)

    @property
    def share_a(self) -> float:
        return self.tokens_a / self.size_a if self.size_a else 0.0

    @property
    def share_b(self) -> float:
        return self.tokens_b / self.size_b if self.size_b else 0.0

    @property
    def strong(self) -> bool:
        return min(self.tokens_a, self.tokens_b) >= STRONG_TOKENS and min(self.share_a, self.share_b) >= STRONG_SHARE


def _covered(own: OwnCode, shared: set) -> tuple:
    """(tokens of `own` inside a k-gram in `shared`, their source lines)."""
    marked = bytearray(own.size)
    for i, h in enumerate(own.kgrams):
        if h is not None and h in shared:
            marked[i:i + K] = b"\1" * K
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
    matches = []
    for (a, b), _ in candidates.items():
        shared = {h for h in kgram_sets[a] & kgram_sets[b] if held[h] <= common}
        tokens_a, lines_a = _covered(owns[a], shared)
        tokens_b, lines_b = _covered(owns[b], shared)
        m = CodeMatch(a, b, tokens_a, tokens_b, owns[a].size, owns[b].size, lines_a, lines_b)
        if min(tokens_a, tokens_b) >= MIN_TOKENS and max(m.share_a, m.share_b) >= MIN_SHARE:
            matches.append(m)
    matches.sort(key=lambda m: (-max(m.share_a, m.share_b), m.a, m.b))
    return matches, sum(1 for n in held.values() if n > common)
