"""All pairs of hand-ins by their own code (grader.integrity.code), in time that grows with what
they share, not with the number of pairs.

Two kinds of shared piece: a k-gram (K normalised tokens in a row) and a whole statement of at
least MIN_STATEMENT tokens, wherever it stands (a statement moved into a helper of its own, or
among other neighbours, keeps it). What a piece says depends on how many hand-ins hold it: one
that two alone hold is what one of them copied or both were given; one that many hold is an
answer the class converged on. So a piece weighs its rarity, log(n / held) / log(n / 2) over
the n hand-ins with code: 1 when two hold it, 0 when all do (an inverse document frequency,
scaled so that a pair's own piece weighs 1); one held by more than `common` hand-ins and by
more than CODE_COMMON_SHARE of them weighs nothing (an answer a twentieth of a class converged
on, or a handout some of it started from, says nothing about two of them). A token weighs its
rarest piece; a hand-in's distinctive code is the sum over its own code. A pair's shared part,
on each side, is the weight of its tokens inside pieces the other side holds too, and its share
is that over the side's distinctive code. Answers a few students each converged on do not hide
a copy that holds all of them, as a cut at a number of holders would.

Only pairs that share a piece of rarity at least INDEX_RARITY (a winnowed fingerprint, or a
statement of K tokens) are looked at (an inverted index, piece -> hand-ins), and for them the
weights are measured exactly. A pair is listed when it shares at least MIN_TOKENS of weight on
each side and that is at least MIN_SHARE of one side's distinctive code: a copy holds (nearly)
all of what the hand-in it copies wrote, independent solutions share a converged line here and
there. tests/test_integrity_planted.py measures the thresholds on a planted set: no independent
pair there reaches them, and every copy of a hand-in with code of its own (twice MIN_TOKENS) does.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import combinations

from grader.integrity.code import K, OwnCode
from grader.results import ToDict

MIN_TOKENS = 40      # shared distinctive weight (tokens), on each side, for a pair to be listed
MIN_SHARE = 0.8      # ... and at least this share of one side's distinctive code (a copy holds all of it)
STRONG_TOKENS = 80   # strong: this much shared weight ...
STRONG_SHARE = 0.8   # ... making up this share of both sides' distinctive code
INDEX_RARITY = 0.5   # pairs are looked at when they share a fingerprint this rare (held by at most sqrt(2n))
MIN_STATEMENT = 6    # a whole statement this long, shared, is shared wherever it stands
CODE_COMMON_SHARE = 0.05   # k-grams more than this share of the hand-ins hold (and more than `common`) weigh nothing


@dataclass
class CodeMatch(ToDict):
    """Two hand-ins' shared own code, both sides by the measure that lists them: k-grams, else whole
    statements."""
    a: str
    b: str
    tokens_a: float            # weight of a's own tokens in pieces b holds too (k-grams, or statements)
    tokens_b: float
    size_a: int                # tokens of a's own code
    size_b: int
    lines_a: list = field(default_factory=list)   # source lines of a holding shared tokens
    lines_b: list = field(default_factory=list)
    distinct_a: float = None   # weight of a's distinctive code, by the measure of share_a
    distinct_b: float = None
    share_a: float = 0.0       # the share of a's distinctive code b holds too, by the same measure
    share_b: float = 0.0

    @property
    def strong(self) -> bool:
        return min(self.tokens_a, self.tokens_b) >= STRONG_TOKENS and min(self.share_a, self.share_b) >= STRONG_SHARE


def code_cut(common: int, n: int) -> int:
    """The most hand-ins of `n` a k-gram may be held by and still weigh anything."""
    return max(common, math.ceil(CODE_COMMON_SHARE * n))


def rarity(held: int, n: int) -> float:
    """What a k-gram held by `held` of `n` hand-ins says: 1 held by two (or fewer), 0 by all."""
    if held <= 2 or n <= 2:
        return 1.0
    return max(0.0, math.log(n / held) / math.log(n / 2))


def _weights(own: OwnCode, weight: dict) -> list:
    """Each token's weight: the greatest of the k-grams it is in (`weight`: hash -> weight)."""
    found = [0.0] * own.size
    for i, h in enumerate(own.kgrams):
        w = weight.get(h, 0.0) if h is not None else 0.0
        for j in range(i, min(i + K, own.size)):
            if w > found[j]:
                found[j] = w
    return found


def _statement_weights(own: OwnCode, weight: dict) -> list:
    """Each token's weight: its statement's, for a statement of MIN_STATEMENT tokens (`weight`:
    tokens -> weight); 0 for a shorter one."""
    found = []
    for tokens, _ in own.units:
        found += [weight.get(tokens, 0.0) if len(tokens) >= MIN_STATEMENT else 0.0] * len(tokens)
    return found


@dataclass
class _Side:
    """One hand-in's own code, weighed both ways: by k-grams and by whole statements."""
    own: OwnCode
    kgrams: list      # each token's k-gram weight
    statements: list  # each token's statement weight

    def shared(self, kgrams: dict, statements: dict) -> list:
        """[(shared weight, its share of the side's distinctive code, that code's weight, source
        lines)] of what the other side holds too, measured by k-grams, then by statements."""
        found = []
        for tokens, size in ((_weights(self.own, kgrams), sum(self.kgrams)),
                             (_statement_weights(self.own, statements), sum(self.statements))):
            got = sum(tokens)
            found.append((got, min(got / size, 1.0) if size else 0.0, size,
                          sorted({self.own.lines[i] for i, w in enumerate(tokens) if w})))
        return found


def _listed(a: tuple, b: tuple) -> bool:
    """Whether two sides' measures (shared weight, share, ...) make a pair to list."""
    return min(a[0], b[0]) >= MIN_TOKENS and max(a[1], b[1]) >= MIN_SHARE


def _held(sets: dict, n: int, cut: int) -> tuple:
    """(holders of each item of the `sets`, each item's weight)."""
    held = Counter(x for xs in sets.values() for x in xs)
    return held, {x: rarity(count, n) if count <= cut else 0.0 for x, count in held.items()}


def similar_pairs(owns: dict, common: int) -> tuple:
    """([CodeMatch] listed, sorted by share), and the number of k-grams more than `common` hand-ins
    (and CODE_COMMON_SHARE of them) hold: the answers many converged on, which weigh nothing.
    `owns` maps a key (the student) to its OwnCode; hand-ins without code are left out."""
    owns = {key: own for key, own in owns.items() if own and own.size}
    kgram_sets = {key: {h for h in own.kgrams if h is not None} for key, own in owns.items()}
    statement_sets = {key: {t for t, _ in own.units if len(t) >= MIN_STATEMENT} for key, own in owns.items()}
    n = len(owns)
    cut = code_cut(common, n)
    held, weight = _held(kgram_sets, n, cut)
    held_statements, statement_weight = _held(statement_sets, n, cut)
    index = defaultdict(list)   # a rare fingerprint or a rare statement of K tokens -> its holders
    for key, own in owns.items():
        for fp in own.fingerprints:
            if held[fp] >= 2 and weight[fp] >= INDEX_RARITY:
                index[fp].append(key)
        for tokens in statement_sets[key]:
            if len(tokens) >= K and held_statements[tokens] >= 2 and statement_weight[tokens] >= INDEX_RARITY:
                index[tokens].append(key)
    candidates = set()
    for keys in index.values():
        candidates.update(combinations(sorted(keys), 2))
    sides = {key: _Side(owns[key], _weights(owns[key], weight), _statement_weights(owns[key], statement_weight))
             for key in {k for pair in candidates for k in pair}}
    matches = []
    for a, b in sorted(candidates):
        shared = {h: weight[h] for h in kgram_sets[a] & kgram_sets[b]}
        both = {t: statement_weight[t] for t in statement_sets[a] & statement_sets[b]}
        measures = list(zip(sides[a].shared(shared, both), sides[b].shared(shared, both)))
        side_a, side_b = next((m for m in measures if _listed(*m)), measures[0])   # k-grams, unless statements list it
        if _listed(side_a, side_b):
            matches.append(CodeMatch(a, b, round(side_a[0], 1), round(side_b[0], 1), owns[a].size, owns[b].size,
                                     side_a[3], side_b[3], round(side_a[2], 1), round(side_b[2], 1), side_a[1],
                                     side_b[1]))
    matches.sort(key=lambda m: (-max(m.share_a, m.share_b), m.a, m.b))
    return matches, sum(1 for count in held.values() if count > cut)
