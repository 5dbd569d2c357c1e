"""The four kinds of evidence, over every pair of hand-ins, and the pairs a person should compare.

Each kind is a grouping of hand-ins by something independent work does not share; two hand-ins
in one group make a pair. Evidence that many hand-ins share (more than `common`) is what a class
converges on, and is counted, not listed. Two hand-ins of one student id (a resubmission) are
never paired. What each kind means:

- same run: identical .log bytes, identical .err bytes, the same Slurm job (id, nodes, start
  time), or the same comparisons printed in the same order by several ranks. One run's output in
  two hand-ins. Identical logs without anything run-specific in them (no job header, ranks in a
  sorted order) could come from identical code on identical machines: moderate, not strong.
- same wrong weight: a failing part returned the same wrong weight (grading.json's weight_digest)
  at a check. Right answers agree by design; a wrong one the grader cannot name is rare, and
  shared only by shared code (strong). A usual mistake the grader names (a sum, not a mean) is
  made independently: shared in two parts it is moderate, in one it is weak, shown only beside
  other evidence.
- same code: what the two wrote beyond the skeleton, normalised (grader.integrity.code), less
  what most of the batch holds beyond it (a course's own handout, say: code.class_template).
- same sha256: assignment4.py byte for byte, or the code sha256 their logs' init lines print,
  with two student ids. The untouched skeleton is left out. Bytes are only as telling as what
  they hold beyond the base: the skeleton with the expected answers typed in is what every
  student who types them writes (weak: shown beside other evidence, never listed alone); a
  file with lines of its own (comments count: they are typed, not converged on) is strong.

What a student can plant in their own log from public facts (another's job header in a log that
contradicts theirs, another's code sha256 beside one's own) is no evidence against the other:
grader.integrity.facts says what it is, moderate, against the log that holds it.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations

from grader import kit
from grader.integrity import facts as log_claims   # what a log claims, against what it prints
from grader.integrity.code import class_template, without
from grader.integrity.similar import MIN_TOKENS, code_cut, similar_pairs
from grader.results import ToDict

STRONG, MODERATE, WEAK = "strong", "moderate", "weak"   # weak: shown beside other evidence, never listed alone
KINDS = {"same_run": "the same run", "same_wrong_weight": "the same wrong behaviour",
         "same_code": "the same code beyond the skeleton", "same_sha256": "the same code sha256",
         log_claims.CONTRADICTION: "a log at odds with itself or the other"}   # against one log, not a shared thing
SHOWN_LINES = 12   # lines of shared code shown per hand-in
SHA_OWN_LINES = 5  # byte-identical files with this many lines of their own (comments too) are strong evidence
# What is counted, not listed, when more than `common` hand-ins share it.
LOGS = "identical .log files with nothing run-specific in them"
ERRS = "identical .err files"
CLAIMS = "sequences of printed comparisons"
WEIGHTS = "wrong weights (usual mistakes)"
KGRAMS = "k-grams of own code (answers many converged on: they weigh nothing)"
TEMPLATE = "statements of code beyond the base that most hand-ins hold (what the class was given: left out)"
ALONE = ("pairs sharing only weak evidence, one usual mistake or the skeleton with the expected answers byte for "
         "byte (not listed on that alone)")


@dataclass
class Evidence(ToDict):
    """One thing two hand-ins share, with what each shows."""
    kind: str          # a key of KINDS
    strength: str      # STRONG, MODERATE or WEAK
    summary: str       # one line, for integrity.csv
    a: list = field(default_factory=list)   # what student_a's hand-in shows, line by line
    b: list = field(default_factory=list)


@dataclass
class Pair(ToDict):
    """Two hand-ins a person should compare, and why."""
    student_a: str
    student_b: str
    evidence: list = field(default_factory=list)   # Evidence, in the order of KINDS

    @property
    def strength(self) -> str:
        """strong: one strong piece of evidence, or two kinds of it (weak evidence, and a log at odds
        with itself or the other, which counts against one log, do not count)."""
        kinds = {e.kind for e in self.evidence if e.strength != WEAK and e.kind != log_claims.CONTRADICTION}
        return STRONG if any(e.strength == STRONG for e in self.evidence) or len(kinds) > 1 else MODERATE

    def to_dict(self) -> dict:
        return {**super().to_dict(), "strength": self.strength}


def short(digest: str) -> str:
    return digest[:12] + "..." if digest else "-"


class _Pairs:
    """Evidence gathered per pair, and what was taken as common."""

    def __init__(self, facts: list, common: int):
        self.facts, self.common = {f.student: f for f in facts}, common
        self.pairs, self.commons, self.weak = {}, defaultdict(int), {}

    def add(self, x, y, evidence: Evidence) -> None:
        """Evidence of x and y; weak evidence waits until the pair has other (`attach_weak`)."""
        if x.student_id == y.student_id:
            return   # one student's two hand-ins
        (a, b), swap = sorted((x.student, y.student)), x.student > y.student
        if swap:
            evidence.a, evidence.b = evidence.b, evidence.a
        if evidence.strength == WEAK:
            self.weak.setdefault((a, b), []).append(evidence)
        else:
            self.pairs.setdefault((a, b), Pair(a, b)).evidence.append(evidence)

    def attach_weak(self) -> int:
        """Weak evidence of the pairs listed for something else; return how many pairs had only weak."""
        for key, evidence in self.weak.items():
            if key in self.pairs:
                self.pairs[key].evidence += evidence
        return sum(key not in self.pairs for key in self.weak)

    def has(self, x, y, kind: str, word: str = "") -> bool:
        pair = self.pairs.get(tuple(sorted((x.student, y.student))))
        return bool(pair) and any(e.kind == kind and word in e.summary for e in pair.evidence)

    def groups(self, key, what: str, capped: bool = True):
        """The groups of two or more hand-ins with the same `key(facts)` (None: in none); groups
        larger than `common` are counted as common `what` and left out when `capped`."""
        by = defaultdict(list)
        for f in self.facts.values():
            k = key(f)
            if k is not None:
                by[k].append(f)
        for k, group in by.items():
            if len(group) > 1 and capped and len(group) > self.common:
                self.commons[what] += 1
            elif len(group) > 1:
                yield k, group


def _job_text(f) -> str:
    job = f.job
    return (f"job {job.get('id', '?')} on {job.get('nodes') or '?'}, started {job.get('started', '?')}"
            if job.get("id") else "no job header")


def same_run(p: _Pairs) -> None:
    for digest, group in p.groups(lambda f: f.log_sha256 or None, LOGS, capped=False):
        provenance = group[0].log_provenance
        if not provenance and len(group) > p.common:
            p.commons[LOGS] += 1
            continue
        why = _job_text(group[0]) if provenance else "nothing run-specific in it (no job header, ranks in sorted order)"
        for x, y in combinations(group, 2):
            p.add(x, y, Evidence("same_run", STRONG if provenance else MODERATE,
                                 f"identical .log bytes (sha256 {short(digest)}; {why})",
                                 [f"`{x.files.get('log')}`, {len(x.claims)} comparison lines"],
                                 [f"`{y.files.get('log')}`, {len(y.claims)} comparison lines"]))
    for digest, group in p.groups(lambda f: f.err_sha256 or None, ERRS):
        for x, y in combinations(group, 2):
            p.add(x, y, Evidence("same_run", MODERATE, f"identical .err bytes (sha256 {short(digest)}, "
                                 f"{x.err_lines} lines)", [f"`{x.files.get('err')}`"], [f"`{y.files.get('err')}`"]))
    def job(f):
        return (f.job.get("id"), f.job.get("nodes", ""), f.job.get("started")) \
            if f.job.get("id") and f.job.get("started") else None
    for _, group in p.groups(job, "", capped=False):
        for x, y in combinations(group, 2):
            if p.has(x, y, "same_run", ".log bytes"):
                continue
            kind, strong, said = log_claims.job_evidence(x, y, _job_text(x))   # a header is public: typed, not run
            p.add(x, y, Evidence(kind, STRONG if strong else MODERATE, said, [_job_text(x)], [_job_text(y)]))
    def claims(f):
        return hashlib.sha256("\n".join(f.claims).encode()).hexdigest() \
            if f.claims_run_specific and len(f.claims) > 1 else None
    for _, group in p.groups(claims, CLAIMS):
        for x, y in combinations(group, 2):
            if not p.has(x, y, "same_run", ".log bytes"):
                p.add(x, y, Evidence("same_run", MODERATE, f"the same {len(x.claims)} comparisons printed in the same "
                                     f"order, ranks interleaved alike, in logs that differ elsewhere",
                                     [f"`{c}`" for c in x.claims[:4]], [f"`{c}`" for c in y.claims[:4]]))


def same_wrong_weight(p: _Pairs) -> None:
    shared = defaultdict(list)   # (a, b) -> [(x's WrongWeight, y's)]
    by = defaultdict(list)       # the same wrong weight: the same rubric, part, check and digest
    for f in p.facts.values():
        for w in f.wrong:
            by[(w.rubric, w.part, w.check, w.digest)].append((f, w))
    for group in by.values():
        if len(group) > p.common:
            p.commons[WEIGHTS] += 1
            continue
        for (x, wx), (y, wy) in combinations(group, 2):
            shared[(x.student, y.student)].append((wx, wy))
    for (a, b), both in shared.items():
        x, y = p.facts[a], p.facts[b]
        parts = sorted({w.part for w, _ in both})
        unnamed = [w for w, _ in both if not w.named]
        checks = ", ".join(f"{w.part} at {'hidden ' if w.hidden else ''}check '{w.check}'" for w, _ in both[:4])
        what = ("a wrong weight the grader cannot name" if unnamed else
                "usual mistakes: " + "; ".join(dict.fromkeys(w.diagnosis for w, _ in both)))
        p.add(x, y, Evidence("same_wrong_weight", STRONG if unnamed else MODERATE if len(parts) > 1 else WEAK,
                             f"the same wrong weight in {len(both)} check(s): {checks}; {what}",
                             [f"{w.part} @ {w.check}: {w.diagnosis or '-'} (digest {short(w.digest)})" for w, _ in both],
                             [f"{w.part} @ {w.check}: {w.diagnosis or '-'} (digest {short(w.digest)})" for _, w in both]))


def _shown(f, lines: list) -> list:
    source = f.code.splitlines()
    return [f"{n}: {source[n - 1].strip()}" for n in lines[:SHOWN_LINES] if 0 < n <= len(source)]


def same_code(p: _Pairs, base=None) -> None:
    owns = {s: f.own for s, f in p.facts.items() if f.own is not None}
    template = class_template(list(owns.values())) if base is not None else set()
    if template:
        owns = {s: without(own, template, base) for s, own in owns.items()}
        p.commons[TEMPLATE] = len(template)
    matches, common = similar_pairs(owns, p.common)
    if common:
        cut = code_cut(p.common, sum(1 for own in owns.values() if own and own.size))
        p.commons[f"{KGRAMS}, each held by more than {cut} hand-ins"] += common
    for m in matches:
        x, y = p.facts[m.a], p.facts[m.b]
        said = (f"own code beyond the skeleton shared: {m.tokens_a:.0f} weighted tokens, {m.share_a:.0%} of {m.a}'s "
                f"distinctive code ({m.size_a} tokens of its own in all), and {m.tokens_b:.0f}, {m.share_b:.0%} of "
                f"{m.b}'s ({m.size_b} in all); a token weighs by how few hand-ins hold its k-gram or statement, "
                f"after renaming, comments, layout and the order of independent lines are normalised away")
        p.add(x, y, Evidence("same_code", STRONG if m.strong else MODERATE, said,
                             _shown(x, m.lines_a), _shown(y, m.lines_b)))


def _sha_strength(holder) -> tuple:
    """(strength, why) of two hand-ins sharing the bytes of `holder`'s assignment4.py (None: no
    hand-in holds them, only logs ran them). Byte-identical files of the skeleton with the expected
    answers are what everyone who types the handout's answers writes: weak, shown only beside other
    evidence. Lines of its own, comments included, make the bytes a hand-in's own."""
    if holder is None:
        return MODERATE, "code no hand-in holds, run by both"
    own, tokens = holder.own_lines, holder.own.size if holder.own else 0
    if own >= SHA_OWN_LINES or tokens >= MIN_TOKENS:
        return STRONG, f"{own} line(s) of its own beyond the skeleton and the expected answers"
    if own:
        return MODERATE, f"only {own} line(s) of its own beyond the skeleton and the expected answers"
    return WEAK, "the skeleton with the expected answers and nothing else: what everyone who types them writes"


def same_sha256(p: _Pairs) -> None:
    skeleton = hashlib.sha256(kit.SKELETON.read_bytes()).hexdigest() if kit.SKELETON.is_file() else ""
    ignored = {skeleton, "", "unknown"}
    holders = defaultdict(list)
    for f in p.facts.values():
        for digest in {f.code_sha256, *f.log_code_sha256} - ignored:
            holders[digest].append(f)

    def role(f, digest) -> str:
        said = ["its assignment4.py"] if f.code_sha256 == digest else []
        said += ["the code its .log ran"] if digest in f.log_code_sha256 else []
        return " and ".join(said)

    for digest, group in holders.items():
        strength, why = _sha_strength(next((f for f in group if f.code_sha256 == digest and f.code), None))
        for x, y in combinations(group, 2):
            planted = [f for f in (x, y) if log_claims.mixed(f, digest)]
            if planted and not p.has(x, y, log_claims.CONTRADICTION, short(digest)):
                p.add(x, y, Evidence(log_claims.CONTRADICTION, MODERATE, log_claims.mixed_summary(
                    digest, planted, [f for f in (x, y) if not log_claims.mixed(f, digest)]),
                    [f"{role(x, digest)}: {digest}"], [f"{role(y, digest)}: {digest}"]))
            elif not planted and not p.has(x, y, "same_sha256"):
                p.add(x, y, Evidence("same_sha256", strength, f"code sha256 {short(digest)} is {x.student}: "
                                     f"{role(x, digest)}; {y.student}: {role(y, digest)} ({why})",
                                     [f"{role(x, digest)}: {digest}"], [f"{role(y, digest)}: {digest}"]))


def find_pairs(facts: list, common: int, base=None) -> tuple:
    """([Pair], {what: how many were taken as common}): every pair with evidence, strongest first,
    and what more than `common` hand-ins shared (counted, not listed). With the code's `base`
    (grader.integrity.code.Base), the statements most hand-ins hold beyond it are dropped first."""
    p = _Pairs(facts, common)
    same_run(p)
    same_wrong_weight(p)
    same_code(p, base)
    same_sha256(p)
    alone = p.attach_weak()
    if alone:
        p.commons[ALONE] = alone
    order = list(KINDS)
    for pair in p.pairs.values():
        pair.evidence.sort(key=lambda e: (order.index(e.kind), [STRONG, MODERATE, WEAK].index(e.strength)))
    pairs = sorted(p.pairs.values(), key=lambda q: (q.strength != STRONG, -len({e.kind for e in q.evidence}),
                                                      q.student_a, q.student_b))
    return pairs, dict(p.commons)
