"""One hand-in's evidence, from what `grade` wrote (OUT/students/<student>/grading.json) and from the
hand-in's own files (found again among the PATHs given to `grade`, by their sha256).

grading.json gives the run's provenance as the grader read it from the .log (job id, nodes, start
time, the code sha256 of the init lines) and, per failing check, the digest of the wrong weight
(`weight_digest`, where the grader records it). The hand-in's files give the bytes of its .log and
.err, the comparisons the run printed in the order it printed them, and its code. Hand-ins are
unpacked with grader.intake.handin, exactly as `grade` unpacks them, into a temporary folder.

What a log claims is only as good as what else it prints: a Slurm job's id, nodes and start time
are public (sacct shows them), and a log's code sha256 is printed for anyone who reads that log,
so a student can type either into their own log and frame whoever they belong to. Hence:

- two logs with the same job header are one run (strong) only when what they print agrees: the
  same comparisons (one maybe a prefix of the other) in the run's own order, or with the same
  code sha256s (`job_evidence`). Logs of one job that contradict each other cannot both be its
  output: one of them claims a job it did not run, reported as such (moderate), never as the same
  run; a header with nothing on both sides to compare is the header only (moderate);
- a code sha256 one log prints beside other code sha256s (a log of mixed fingerprints), and that
  is not its hand-in's own assignment4.py, counts against the log that holds both, not as the
  other student's copying (`mixed`, moderate).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from grader.evidence.logfile import parse_log
from grader.evidence.logtext import CLAIM, as_bytes, squash
from grader.evidence.runs import rule_of
from grader.intake import handin as handins
from grader.intake.find import discover
from grader.integrity.code import Base, OwnCode, own_code, own_lines
from grader.names import result_files, student_of
from grader.results import ToDict

CONTRADICTION = "contradiction"   # the kind of evidence a planted claim is (grader.integrity.evidence)
NOT_A_DIGEST = {"", "unknown"}
MAX_CODE_BYTES = 512 * 1024   # more of assignment4.py than this is not compared (the reference is 17 KB)
# Diagnoses (grader.verdict.compare.diagnose) that name no usual mistake: a wrong weight the grader
# could not explain. Two hand-ins sharing one of these share something rare.
UNNAMED = ("differs from the reference", "the update points the right way but is")


@dataclass
class WrongWeight(ToDict):
    """A failing part's wrong weight at one check, as the grader recorded it."""
    part: str
    check: str
    hidden: bool
    digest: str        # grading.json's weight_digest: the same digest, the same wrong weight
    diagnosis: str     # what the grader said the weight looks like
    rubric: str        # the rubric's sha256: checks of different rubrics are not compared

    @property
    def named(self) -> bool:
        """The diagnosis names a usual mistake (many students make it independently)."""
        d = self.diagnosis
        return bool(d) and not d.startswith(UNNAMED) and not (d.startswith("wrong shape") and "expected" in d)


@dataclass
class HandinFacts:
    """What one hand-in shows that another could share."""
    student: str                 # its folder in OUT
    source: str                  # the hand-in's file or folder name
    sha256: str                  # of the hand-in as graded
    student_id: str              # the student's id: two hand-ins of one student are not compared
    status: str = ""
    found: bool = False          # its files were found among the PATHs and read
    problem: str = ""            # why not, when they were not
    files: dict = field(default_factory=dict)       # role -> name in the hand-in
    log_sha256: str = ""
    err_sha256: str = ""         # "" when there is no .err or it is empty
    err_lines: int = 0
    job: dict = field(default_factory=dict)         # the [Job] fields: id, nodes, started ...
    claims: list = field(default_factory=list)      # the "Tensors match" lines, in printed order
    claims_run_specific: bool = False   # several ranks, in an order no other run need repeat
    log_code_sha256: list = field(default_factory=list)   # the code sha256 of the log's init lines
    code_sha256: str = ""        # of its assignment4.py
    code: str = ""               # its assignment4.py (for showing shared lines)
    own: OwnCode = None          # its own code beyond the base
    own_lines: int = 0           # lines of its assignment4.py, comments included, no file of the base has
    wrong: list = field(default_factory=list)       # WrongWeight

    @property
    def log_provenance(self) -> bool:
        """The log holds something only one run prints: a job id and start time, or the ranks'
        lines in an order of their own."""
        return bool(self.job.get("id") and self.job.get("started")) or self.claims_run_specific


def load_results(out: Path) -> tuple:
    """([grading.json as dicts], [problems]) of every student folder in `out`."""
    results, problems = [], []
    for path in result_files(out):   # .replaced/, results set aside by a regrade, left out
        try:
            data = json.loads(path.read_text())
            data["student"] = data.get("student") or path.parent.name
            results.append(data)
        except (OSError, ValueError) as e:
            problems.append(f"{path}: cannot be read ({e}); that hand-in is left out")
    return results, problems


def wrong_weights(result: dict) -> list:
    """The wrong weights a result records (checks failed on the weight, with a weight_digest)."""
    found = []
    for part_id, part in (result.get("parts") or {}).items():
        for o in part.get("checks") or []:
            if o.get("status") == "failed" and o.get("weight_digest"):
                found.append(WrongWeight(part=part.get("part", part_id), check=o.get("check", ""),
                                         hidden=bool(o.get("hidden")), digest=o["weight_digest"],
                                         diagnosis=o.get("diagnosis") or "", rubric=result.get("rubric_sha256", "")))
    return found


def printed_claims(log: bytes) -> tuple:
    """(the comparisons the run printed, in order; whether that order is the run's own): several
    ranks whose lines are not in the order of a sorted listing (part by part, rank by rank)."""
    claims = [(squash(c[0]), c[1], int(c[2])) for c in CLAIM.findall(as_bytes(log)) if c[3]]
    first = {}
    for _, prefix, _ in claims:
        first.setdefault(prefix, len(first))
    keyed = [(first[prefix], rank) for _, prefix, rank in claims]
    own_order = len({rank for _, _, rank in claims}) > 1 and keyed != sorted(keyed)
    return [text for text, _, _ in claims], own_order


def match_handins(results: list, paths, pattern: str) -> tuple:
    """({student: Handin} for the results whose hand-in is under `paths`, [problems]). A hand-in is
    matched by its sha256, as graded; failing that, by its name (and said to have changed)."""
    found, problems = discover(paths, pattern) if paths else ([], [])
    by_sha, by_name = defaultdict(list), defaultdict(list)
    for h in found:
        by_sha[h.sha256].append(h)
        by_name[h.name].append(h)
    matched, notes = {}, [message for _, message in problems]
    for r in results:
        same = by_sha.get(r.get("sha256") or "", [])
        pick = next((h for h in same if h.name == r.get("source")), same[0] if same else None)
        if pick is None and by_name.get(r.get("source")):
            pick = by_name[r["source"]][0]
            notes.append(f"{r['student']}: {r['source']} has changed since it was graded (its sha256 differs); "
                         f"its files as they are now were compared")
        if pick is not None:
            matched[r["student"]] = pick
    return matched, notes


def read_facts(result: dict, handin, base: Base, rubric) -> HandinFacts:
    """The facts of one graded hand-in; `handin` (a grader.intake.handin.Handin) may be None. It is
    unpacked with the rubric's limits and log rule, as grading unpacks it, so that both pick the same run."""
    facts = HandinFacts(student=result["student"], source=result.get("source", ""), sha256=result.get("sha256", ""),
                        student_id=student_of(result["student"]),
                        status=result.get("status", ""), wrong=wrong_weights(result))
    log = result.get("log") or {}
    facts.job = dict(log.get("job") or {})
    facts.log_code_sha256 = list(log.get("fingerprints") or [])
    if handin is None:
        facts.problem = "not found among the PATHs given"
        return facts
    with tempfile.TemporaryDirectory(prefix="a4-integrity-") as tmp:
        try:
            unpacked = handins.unpack(handin, Path(tmp) / "files", rubric.files, rule_of(rubric))
        except handins.HandinError as e:
            facts.problem = f"cannot be unpacked: {e}"
            return facts
        facts.found = True
        files = unpacked.files
        facts.files = {role: str(path.relative_to(unpacked.root)) for role, path in files.items()}
        if "log" in files:
            raw = files["log"].read_bytes()
            facts.log_sha256 = hashlib.sha256(raw).hexdigest()
            facts.claims, facts.claims_run_specific = printed_claims(raw)
            if not log:   # grading.json has no log report: read the log as the grader would
                report = parse_log(raw)
                facts.job, facts.log_code_sha256 = dict(report.job), list(report.fingerprints)
        if "err" in files:
            raw = files["err"].read_bytes()
            if raw.strip():
                facts.err_sha256, facts.err_lines = hashlib.sha256(raw).hexdigest(), raw.count(b"\n") + 1
        data = files["assignment"].read_bytes()
        facts.code_sha256 = hashlib.sha256(data).hexdigest()
        facts.code = data[:MAX_CODE_BYTES].decode("utf-8", "replace")
        facts.own = own_code(facts.code, base)
        facts.own_lines = own_lines(facts.code, base)
    return facts


# --- what a log claims, against what it and the other log print --------------------------------

def job_evidence(x, y, job: str) -> tuple:
    """(kind, strong, summary) of the logs of x and y, which carry the same job header (`job`, in
    words): the same run (strong) when what they print agrees, the same comparisons in the run's own
    order, or with the same code sha256s; a contradiction when it does not; else only the header,
    which is public (moderate)."""
    cx, cy = x.claims, y.claims
    fx, fy = set(x.log_code_sha256) - NOT_A_DIGEST, set(y.log_code_sha256) - NOT_A_DIGEST
    consistent = bool(cx and cy) and cx[:len(cy)] == cy[:len(cx)]
    ordered = consistent and x.claims_run_specific and y.claims_run_specific
    why = ("they print different comparisons (or the same ones in another order)" if cx and cy and not consistent
           else "their init lines print different code sha256s" if fx and fy and fx != fy and not ordered else "")
    if why:
        return CONTRADICTION, False, (f"the same Slurm job header ({job}) in two logs that contradict each "
                                      f"other: {why}. One run cannot have printed both, so one of the two logs "
                                      f"claims a job it did not run (sacct says whose job it was); a job header "
                                      f"is public, and this is not evidence of a shared run")
    if ordered or (consistent and fx and fx == fy):
        return "same_run", True, f"the same Slurm job: {job}"
    return "same_run", False, (f"the same Slurm job header ({job}), and nothing else the two logs print shows one "
                               f"run (no comparisons or code sha256s on both sides to compare): a job header is "
                               f"public (sacct shows it)")


def mixed(f, digest: str) -> bool:
    """`digest` is only in f's log, beside other code sha256s: not its assignment4.py, and its log
    mixes fingerprints (a code sha256 typed or pasted in beside its own)."""
    prints = set(f.log_code_sha256) - NOT_A_DIGEST
    return f.code_sha256 != digest and digest in prints and len(prints) > 1


def mixed_summary(digest: str, holders: list, others: list) -> str:
    names = " and ".join(f.student for f in holders)
    other = " and ".join(f"{f.student}'s" for f in others) or "the other's"
    return (f"code sha256 {digest[:12]}... is printed in {names}'s log beside other code sha256s (a log of mixed "
            f"fingerprints, which one run does not print): this counts against {names}'s log, which holds "
            f"both, not as {other} copying; a code sha256 printed in a log can be typed into another")
