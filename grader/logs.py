"""Log evidence: what a hand-in's `.log` (stdout) and `.err` (stderr) say happened on the cluster.

    parse_log(data, min_world_size=4) -> LogReport   init lines, every part on every rank, footer
    parse_err(data)                        -> ErrReport   traceback, NCCL, Slurm, out of memory

A log is evidence, not the verdict (it can be stale or forged; the grade comes from our re-run).
Two dialects reach us. This kit's (a4): every part logs "[Prefix][Rank r] Tensors match: ..." on
every rank, and passes when ranks 0..world_size-1 all claim True. The original handout's: the
baseline and accumulation comparisons have no prefix and come from rank 0 only (the first is the
baseline, the second the accumulation); that baseline compares the initial weight with the updated
one, so "False" with a max diff > 0 is its passing outcome. Prefixes students invent
("[TensorParallel]", "[GradAccum]") are matched to parts by keyword.

Clusters mangle output (srun --label and torchrun prefixes, ranks spliced into one line, CRLF,
colour codes, invalid UTF-8, a cut-off last line), so the patterns search the whole text as bytes,
never only line starts. Nothing here raises: a parser failure becomes a `parse_error` flag.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import Enum

from grader.parts import BY_ID, PART_IDS, PARTS

# ---- Every pattern of both files, in one place -------------------------------------------------

ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")
# A claim anywhere in the text: "[Prefix][Rank r] Tensors match: True | Max diff: x | Mean diff: y"
# (prefix optional), "[Prefix][Rank r] Not implemented yet: ...", or "[Rank r] done".
# Groups: 1 the claim's text, 2 prefix, 3 rank, 4 True/False, 5 max diff, 6 not implemented, 7 done.
# Ranks and world sizes have at most 4 digits, so that no line can make a report of a million ranks.
CLAIM = re.compile(
    rb"(\[(?:([A-Za-z][\w \-]{0,38}+)\]\s*+\[)?Rank (\d{1,4}+)\]\s*+"
    rb"(?:Tensors match:\s*+(True|False)(?:\s*+\|\s*+Max diff:\s*+([\w.+\-]++))?"
    rb"(?:\s*+\|\s*+Mean diff:\s*+[\w.+\-]++)?(?:\s*+\|\s*+shapes \[[\d, ]*\] vs \[[\d, ]*\])?"
    rb"|(Not implemented)[^\r\n\[]{0,160}+|(done)\b(?![ \t]*+[A-Za-z])))")
# "[Distributed Init] Rank r initialized on ...": ours (groups 2-8: node, host, device, backend,
# world size, torch, code sha256) or the handout's "... on {node_id} on GPU {local_rank}." (9, 10).
INIT = re.compile(
    rb"\[Distributed Init\]\s*+Rank (\d{1,4}+) initialized on (?:node (\S+) \(([^)\r\n]*)\) on (\S+) \| "
    rb"backend (\w+) \| world size (\d{1,4}+)(?: \| torch (\S+))?(?: \| code sha256 (\w+))?"
    rb"|(\S+) on GPU (\d+))")
JOB = re.compile(rb"\[Job\] ([^\r\n]*)")               # slurm/common.sh: header and footer lines
JOB_STATUS = re.compile(rb"finished status=(-?\w+)")
KEY_VALUE = re.compile(r"(\w+)=(\S*)")
# Invented prefixes, by keyword, tried in this order after the exact prefixes of grader.parts.
PREFIX_KEYWORDS = (("grad_accumulation", ("accum", "micro")),
                   ("tensor_parallel", ("tensor", "column", "tp", "modelparallel")),
                   ("data_parallel", ("data", "dp")),
                   ("baseline", ("baseline", "single", "reference")))

TRACEBACK = re.compile(rb"Traceback \(most recent call last\):")
SYNTAX_ERROR = re.compile(rb"(?:SyntaxError|IndentationError|TabError): [^\r\n]*")  # no "Traceback" line
LINE_PREFIX = re.compile(r"^[ \t]*(?:\d+: ?)?(?:\[(?:rank|default)(\d+)\]: ?)?")  # srun --label, torchrun
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?::|$)")              # "ValueError: ...", "KeyboardInterrupt"
CARETS = re.compile(r"[ \t]*[\^~]+[ \t]*")
ROOT_CAUSE = re.compile(rb"Root Cause \(first observed failure\):[\s\S]{0,400}?rank\s*:\s*(\d+)"
                        rb"[\s\S]{0,200}?exitcode\s*:\s*(-?\d+)")
NCCL = re.compile(rb"NCCL error|nccl[A-Z]\w*Error|Watchdog caught collective operation timeout")
SLURM = re.compile(rb"(?:slurmstepd|srun)\S*: [^\r\n]*?(?:CANCELLED|TIME LIMIT|[Nn]ode failure|NODE FAIL|"
                   rb"PREEMPT|[Aa]borted|Exited with exit code|Out Of Memory)")
OOM = re.compile(rb"out of memory|Out Of Memory|OutOfMemoryError|oom[_-]kill|MemoryError|Killed")
OOM_KILLED = re.compile(r"^Killed$|\d Killed\b")   # "Killed" alone, or bash's "line 9: 4711 Killed  ..."
COLLECTIVE_TIMEOUT = re.compile(rb"Watchdog caught collective operation timeout|Timed out waiting \d+ ?ms")
# Literals one of which every match of an .err pattern contains: a file without any of them skips
# the pattern (alternations search slowly, and a long .err of NCCL_DEBUG output is common).
NEEDLES = {NCCL: (b"NCCL", b"nccl", b"Watchdog"), SLURM: (b"slurmstepd", b"srun"),
           OOM: (b"emory", b"oom", b"Killed"), COLLECTIVE_TIMEOUT: (b"Watchdog", b"Timed out")}

HANDOUT_RANK0_PARTS = ("baseline", "grad_accumulation")   # in this order, unprefixed in the handout
EXCERPT_LINES = 8      # claim lines quoted per part
REPORT_LINES = 10      # lines kept per kind of .err evidence
TRACEBACK_HEAD = 15    # cleaned lines kept of a traceback, its exception line the last
TRACEBACK_SCAN = 64_000  # bytes read after "Traceback (...)" to find its exception


class Dialect(str, Enum):
    A4 = "a4"
    HANDOUT = "handout"
    UNKNOWN = "unknown"


class RankClaim(str, Enum):
    MATCH = "match"
    MISMATCH = "mismatch"
    NOT_IMPLEMENTED = "not_implemented"
    MISSING = "missing"
    CONFLICTING = "conflicting"


def _plain(value):
    """asdict() made JSON-ready: enums as their values, dict keys as str, inf and nan as "inf", "nan"."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(_plain(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class _Result:
    def to_dict(self) -> dict:
        return _plain(asdict(self))

    def flag_codes(self) -> list[str]:
        return [f.code for f in getattr(self, "flags", [])]


@dataclass
class LogFlag(_Result):
    code: str      # "missing_ranks", "separate_worlds", "python_error", "oom", ...
    message: str   # one plain sentence a student can act on


@dataclass
class PartEvidence(_Result):
    part: str                                                  # a part id of grader.parts
    passed: bool = False                                       # claims correct on every expected rank
    ranks: dict[int, RankClaim] = field(default_factory=dict)  # every expected rank, and any other seen
    max_diff: float | None = None                              # the largest "Max diff" of its lines
    message: str = "no line for this part"
    excerpt: list[str] = field(default_factory=list)           # the claims it rests on, as logged


@dataclass
class LogReport(_Result):
    dialect: Dialect = Dialect.UNKNOWN
    world_size: int | None = None      # stated by our init lines, else the ranks seen and the header
    init_ranks: list[int] = field(default_factory=list)        # in order, duplicates kept
    done_ranks: list[int] = field(default_factory=list)
    fingerprints: list[str] = field(default_factory=list)      # distinct code sha256, in order
    hosts: dict[int, str] = field(default_factory=dict)        # rank -> host (ours) or node id (handout's)
    backends: list[str] = field(default_factory=list)          # distinct backends of the init lines
    job: dict[str, str] = field(default_factory=dict)          # [Job] header and footer fields
    finished: bool = False           # every rank printed done, and the footer (if any) says status=0
    parts: dict[str, PartEvidence] = field(default_factory=lambda: {p: PartEvidence(p) for p in PART_IDS})
    flags: list[LogFlag] = field(default_factory=list)
    unknown_prefixes: list[str] = field(default_factory=list)  # comparison prefixes naming no part


@dataclass
class ErrReport(_Result):
    exception: str | None = None          # the exception line of the first traceback not torchrun's
    traceback_head: list[str] = field(default_factory=list)
    failed_rank: int | None = None        # torchrun's Root Cause rank, else the traceback's [rankN]
    nccl: list[str] = field(default_factory=list)
    slurm: list[str] = field(default_factory=list)
    oom: list[str] = field(default_factory=list)
    flags: list[LogFlag] = field(default_factory=list)
    exception_rank: int | None = None     # the rank whose traceback `exception` comes from
    exit_code: int | None = None          # the Root Cause's exit code (-9: SIGKILL)


# ---- helpers ----------------------------------------------------------------------------------

def _as_bytes(data) -> bytes:
    """The text as bytes, colour codes removed; b"" when there is nothing but whitespace."""
    data = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data or b"")
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):   # saved as UTF-16 by an editor
        data = data.decode("utf-16", "replace").encode("utf-8", "replace")
    if not data or data.isspace():
        return b""
    return ANSI.sub(b"", data) if b"\x1b" in data else data


def _text(b: bytes) -> str:
    return " ".join(b.decode("utf-8", "replace").split())


def _ranks(ranks) -> str:
    """"rank 2", "ranks 1, 3"; long lists as runs: "ranks 0-7, 9-63"."""
    ranks = sorted(ranks)
    if len(ranks) <= 8:
        return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
    runs = [[ranks[0], ranks[0]]]
    for r in ranks[1:]:
        if r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return "ranks " + ", ".join(f"{a}-{b}" if a < b else f"{a}" for a, b in runs)


def _number(b: bytes) -> float | None:
    try:
        return float(b)
    except ValueError:
        return None


_PART_OF_PREFIX: dict[bytes, str | None] = {}


def part_of_prefix(prefix: bytes | str) -> str | None:
    """The part id a comparison's "[Prefix]" names, tolerantly: "Data Parallel", "GradAccum" ..."""
    key = prefix.encode() if isinstance(prefix, str) else prefix
    if key not in _PART_OF_PREFIX:
        name = re.sub(r"[^a-z0-9]", "", key.decode("utf-8", "replace").lower())
        found = {p.log_prefix.lower(): p.id for p in PARTS}.get(name)
        found = found or next((part for part, words in PREFIX_KEYWORDS if any(w in name for w in words)), None)
        _PART_OF_PREFIX[key] = found
    return _PART_OF_PREFIX[key]


def _flag(report, code: str, message: str) -> None:
    report.flags.append(LogFlag(code, message))


def _clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n - 3].rstrip() + "..."


# ---- .log ------------------------------------------------------------------------------------

def _claims_by_part(comparisons):
    """{part: {rank: [{(kind, changed)}, largest max diff, [excerpts]]}}, the parts that unprefixed
    (handout) comparisons claim, and the prefixes that name no part. kind is "True", "False" or
    "NI" (not implemented); changed says the max diff is not 0 (the handout's baseline needs that)."""
    per, unknown, prefixed = {p: {} for p in PART_IDS}, {}, set()

    def add(part, c):
        diff = _number(c[4]) if c[4] else None
        agg = per[part].get(int(c[2]))
        if agg is None:
            agg = per[part][int(c[2])] = [set(), None, []]
        agg[0].add(("NI" if c[5] else c[3].decode(), diff != 0))
        if diff is not None and not math.isnan(diff):
            agg[1] = diff if agg[1] is None else max(agg[1], diff)
        if len(agg[2]) < 2 and (text := _text(c[0])) not in agg[2]:
            agg[2].append(text)

    for c in dict.fromkeys(comparisons):   # a long log repeats itself: aggregate before Python work
        if c[1] and (part := part_of_prefix(c[1])):
            prefixed.add(part)
            add(part, c)
        elif c[1]:
            unknown[c[1].decode("utf-8", "replace")] = None
    # Unprefixed comparisons (the handout's) fill, per rank and in order, the parts no prefix took.
    slots = [p for p in HANDOUT_RANK0_PARTS if p not in prefixed]
    seen, assigned = Counter(), {}
    for c in comparisons if slots else ():
        if not c[1]:
            assigned[(slots[seen[c[2]] % len(slots)], c)] = None
            seen[c[2]] += 1
    for part, c in assigned:
        add(part, c)
    return per, {part for part, _ in assigned}, list(unknown)


def _judge(part, claims, expected, handout_baseline) -> PartEvidence:
    """One part's evidence from its per-rank claims."""
    def claim_of(kind, changed):
        if kind == "NI":
            return RankClaim.NOT_IMPLEMENTED
        if handout_baseline:   # initial vs updated weight: they must differ
            return RankClaim.MATCH if kind == "False" and changed else RankClaim.MISMATCH
        return RankClaim.MATCH if kind == "True" else RankClaim.MISMATCH

    ranks = {}
    for r in sorted(set(expected) | set(claims)):
        found = {claim_of(*k) for k in claims[r][0]} if r in claims else {RankClaim.MISSING}
        ranks[r] = found.pop() if len(found) == 1 else RankClaim.CONFLICTING
    diffs = [claims[r][1] for r in claims if claims[r][1] is not None]
    ev = PartEvidence(part, passed=bool(ranks) and all(c is RankClaim.MATCH for c in ranks.values()),
                      ranks=ranks, max_diff=max(diffs) if diffs else None,
                      excerpt=[e for r in sorted(claims) for e in claims[r][2]][:EXCERPT_LINES])
    by = {}
    for r, c in ranks.items():
        by.setdefault(c, []).append(r)
    if ev.passed:
        ev.message = f"matches on all {len(ranks)} ranks" if len(ranks) > 1 else f"matches on {_ranks(ranks)}"
        if handout_baseline and ev.max_diff:
            ev.message = (f"the step changed the weight on {_ranks(ranks)} (max diff {ev.max_diff:.1e}), "
                          "as the handout's baseline expects")
    elif set(by) <= {RankClaim.MISSING}:
        ev.message = "no line for this part"
    elif set(by) == {RankClaim.NOT_IMPLEMENTED}:
        ev.message = "not implemented"
    else:
        said = []
        if bad := by.get(RankClaim.MISMATCH):
            worst = max((claims[r][1] for r in bad if claims[r][1] is not None), default=None)
            if handout_baseline:
                said.append(f"{_ranks(bad)}: Tensors match: True, so the step did not change the weight")
            else:
                said.append(f"{_ranks(bad)}: Tensors match: False"
                            + (f" (max diff {worst:.1e})" if worst is not None else ""))
        if RankClaim.CONFLICTING in by:
            said.append(f"{_ranks(by[RankClaim.CONFLICTING])}: conflicting lines (several runs in one log?)")
        if RankClaim.NOT_IMPLEMENTED in by:
            said.append(f"{_ranks(by[RankClaim.NOT_IMPLEMENTED])}: not implemented")
        if RankClaim.MISSING in by:
            said.append(f"no line for {_ranks(by[RankClaim.MISSING])}")
        ev.message = "; ".join(said)
    return ev


def parse_log(data: bytes | str, min_world_size: int | None = None) -> LogReport:
    """What a run's stdout claims: dialect, world size, every part on every rank, and flags."""
    report = LogReport()
    try:
        _parse_log(data, min_world_size, report)
    except Exception as e:  # evidence only: a parser bug must not end the grading of a batch
        _flag(report, "parse_error", f"The log could not be read completely ({e!r}).")
    return report


def _parse_log(data, min_world_size, report: LogReport) -> None:
    raw = _as_bytes(data)
    if not raw:
        return _flag(report, "empty", "The log is empty: hand in the .log file of a complete run.")
    head = raw[:65536]
    if sum(head.count(bytes([c])) for c in range(32) if c not in (9, 10, 13)) > len(head) // 10:
        _flag(report, "binary", "The log is not text: hand in the .log file the job wrote.")
    claims, inits, job_lines = CLAIM.findall(raw), INIT.findall(raw), JOB.findall(raw)

    for line in dict.fromkeys(job_lines):   # header and footer; a later run's values win
        report.job.update(KEY_VALUE.findall(line.decode("utf-8", "replace")))
    statuses = [m.group(1).decode() for line in job_lines if (m := JOB_STATUS.match(line))]
    footer_missing = sum(1 for line in job_lines if line.startswith(b"id=")) > len(statuses)
    header_ws = int(report.job["world_size"]) if report.job.get("world_size", "").isdigit() else None
    report.init_ranks = [int(t[0]) for t in inits]
    report.done_ranks = [int(c[2]) for c in claims if c[6]]
    report.fingerprints = list(dict.fromkeys(t[7].decode() for t in inits if t[7]))
    report.hosts = {int(t[0]): (t[2] or t[8]).decode("utf-8", "replace") for t in inits}
    report.backends = list(dict.fromkeys(t[4].decode() for t in inits if t[4]))
    comparisons = [c for c in claims if not c[6]]
    per, unprefixed, report.unknown_prefixes = _claims_by_part(comparisons)

    stated = {int(t[5]) for t in inits if t[5]}   # only our init lines state the world size
    if stated:
        report.dialect = Dialect.A4
    elif inits or not all(c[1] for c in comparisons):
        report.dialect = Dialect.HANDOUT
    elif report.done_ranks or any(part_of_prefix(c[1]) for c in comparisons):
        report.dialect = Dialect.A4
    seen = set(report.init_ranks) | set(report.done_ranks) | {r for p in per.values() for r in p}
    report.world_size = max(stated) if stated else max(max(seen) + 1, header_ws or 0) if seen else header_ws
    ws = report.world_size
    everyone = list(range(ws)) if ws else []
    for p in PART_IDS:   # the handout's baseline and accumulation: rank 0 only, initial vs updated weight
        handout = p in unprefixed or (report.dialect is Dialect.HANDOUT and p in HANDOUT_RANK0_PARTS)
        report.parts[p] = _judge(p, per[p], [0] if handout else everyone, handout and p == "baseline")
    _log_flags(report, inits, stated, header_ws, min_world_size, statuses, footer_missing,
               evidence=bool(inits or claims or job_lines))


def _log_flags(report, inits, stated, header_ws, min_ws, statuses, footer_missing, evidence):
    ws, init_counts, done = report.world_size, Counter(report.init_ranks), set(report.done_ranks)
    handout_nodes = {t[8] for t in inits if t[8]}
    if (sum(1 for t in inits if t[0] == b"0" and t[5] == b"1") > 1
            or (not stated and len(inits) > 1 and set(init_counts) == {0}
                and (len(handout_nodes) > 1 or (header_ws or 0) > 1))):
        _flag(report, "separate_worlds", f"{len(inits)} processes each started as rank 0 of a world of their "
              "own: start torchrun on every node with the first node of the job as rendezvous, not localhost.")
    if not inits:
        _flag(report, "no_init_lines", "The log has no '[Distributed Init]' line: it is not the output of a "
              "run of assignment4.py, or the run failed before its process group started.")
    if min_ws and ws and ws < min_ws:
        _flag(report, "world_size_too_small", f"The run had a world size of {ws}, the assignment needs at "
              f"least {min_ws}: run the job on all its nodes and GPUs.")
    if header_ws and ws and header_ws != ws:
        _flag(report, "header_mismatch", f"The job header says world_size={header_ws} but the ranks say {ws}.")
    if twice := [r for r, n in init_counts.items() if n > 1]:
        _flag(report, "duplicate_ranks", f"{_ranks(twice).capitalize()} started more than once: the log holds "
              "several runs (or separate worlds); hand in the log of one run.")
    missing = []
    if inits and ws and (absent := [r for r in range(ws) if r not in init_counts]):
        missing.append(f"no init line from {_ranks(absent)}")
    if inits and done and ws and (absent := [r for r in range(ws) if r not in done]):
        missing.append(f"no 'done' from {_ranks(absent)}")
    for p, ev in report.parts.items():
        absent = [r for r, c in ev.ranks.items() if c is RankClaim.MISSING]
        if absent and len(absent) < len(ev.ranks):
            missing.append(f"no {BY_ID[p].log_prefix} line from {_ranks(absent)}")
    if missing:
        _flag(report, "missing_ranks", "Some ranks are silent where others spoke (" + "; ".join(missing)
              + "): a rank crashed or hung, or its output is missing from this log.")
    not_done = [r for r in range(ws or 0) if r not in done]
    failed = [s for s in statuses if s != "0"]
    report.finished = bool(ws) and not not_done and not footer_missing and not failed
    why = [f"{_ranks(not_done)} never printed 'done'"] if not_done else [] if ws else ["no rank printed 'done'"]
    if footer_missing:
        why.append("the job footer is missing (time limit or cancelled?)")
    if evidence and why:
        _flag(report, "unfinished", f"The run did not finish: {' and '.join(why)}; see the .err file.")
    if failed:
        _flag(report, "job_failed", f"The job ended with status {failed[-1]}: torchrun failed, see the .err "
              "file.")
    if len(report.fingerprints) > 1:
        _flag(report, "mixed_fingerprints", f"The log holds runs of {len(report.fingerprints)} versions of the "
              "code (their code sha256 differ): hand in the log of one run of the code you submit.")
    if report.unknown_prefixes:
        _flag(report, "unknown_prefix", "Comparison lines whose prefix names no part ("
              + ", ".join(f"[{p}]" for p in report.unknown_prefixes[:5]) + "): use the handout's prefixes.")


# ---- .err ------------------------------------------------------------------------------------

def _lines_around(raw: bytes, pattern: re.Pattern, limit=REPORT_LINES) -> list[str]:
    """The distinct whole lines (cleaned) where `pattern` occurs, in order, at most `limit`."""
    found = {}
    if not any(needle in raw for needle in NEEDLES.get(pattern, (b"",))):
        return []
    for m in pattern.finditer(raw):
        start, end = raw.rfind(b"\n", 0, m.start()) + 1, raw.find(b"\n", m.end())
        line = raw[start:end if end >= 0 else len(raw)].decode("utf-8", "replace")
        line = LINE_PREFIX.sub("", line, count=1).strip()
        if m.group() == b"Killed" and not OOM_KILLED.search(line):
            continue   # "task 3: Killed" and the like: killed, but not said to be for memory
        found[line] = None
        if len(found) >= limit:
            break
    return list(found)


def _lines_before(raw: bytes, pos: int, prefix: str, n: int) -> list[str]:
    """The last `n` lines before the line at `pos` that carry `prefix`, without it."""
    lines = raw[max(0, pos - 4000):pos].decode("utf-8", "replace").split("\n")[1:-1]
    return [line[len(prefix):].rstrip("\r") for line in lines if line.startswith(prefix)][-n:]


def _first_exception(raw: bytes):
    """(exception line, cleaned head, rank) of the first traceback that is not torchrun's own."""
    syntax = SYNTAX_ERROR.search(raw)
    for m in TRACEBACK.finditer(raw):
        if syntax and syntax.start() < m.start():
            break
        start = raw.rfind(b"\n", 0, m.start()) + 1
        prefix = raw[start:m.start()].decode("utf-8", "replace")   # "2: [rank2]: ", "" ...
        rank = LINE_PREFIX.match(prefix).group(1)
        head, exception = ["Traceback (most recent call last):"], None
        for line in raw[m.end():m.end() + TRACEBACK_SCAN].decode("utf-8", "replace").split("\n")[1:]:
            if not line.startswith(prefix):   # another rank's or process's line in between
                continue
            line = line[len(prefix):].rstrip("\r")
            if line[:1].isspace() and not CARETS.fullmatch(line):
                head.append(line)
            elif EXCEPTION_LINE.match(line):
                head.append(line)
                exception = line.strip()
                break
        if exception and "ChildFailedError" not in exception and "SignalException" not in exception:
            if len(head) > TRACEBACK_HEAD:   # keep the start and the exception, mark the cut
                head = head[:TRACEBACK_HEAD - 2] + ["  ...", exception]
            return exception, head, int(rank) if rank else None
        # else: torchrun's summary of a failure or a signal; the cause is elsewhere
    if syntax:   # a syntax error in the script itself: Python prints no "Traceback" line
        start = raw.rfind(b"\n", 0, syntax.start()) + 1
        prefix = raw[start:syntax.start()].decode("utf-8", "replace")
        rank = LINE_PREFIX.match(prefix).group(1)
        exception = syntax.group().decode("utf-8", "replace").strip()
        head = [line for line in _lines_before(raw, start, prefix, 3) if not CARETS.fullmatch(line)]
        return exception, head + [exception], int(rank) if rank else None
    return None, [], None


def parse_err(data: bytes | str) -> ErrReport:
    """What a run's stderr says went wrong: the exception, NCCL, Slurm and out-of-memory evidence."""
    report = ErrReport()
    try:
        _parse_err(_as_bytes(data), report)
    except Exception as e:  # evidence only: a parser bug must not end the grading of a batch
        _flag(report, "parse_error", f"The .err could not be read completely ({e!r}).")
    return report


def _parse_err(raw: bytes, report: ErrReport) -> None:
    report.exception, report.traceback_head, report.exception_rank = _first_exception(raw)
    if root := ROOT_CAUSE.search(raw):
        report.failed_rank, report.exit_code = int(root.group(1)), int(root.group(2))
    else:
        report.failed_rank = report.exception_rank
    report.nccl, report.slurm, report.oom = (_lines_around(raw, p) for p in (NCCL, SLURM, OOM))

    if report.exception:
        who = f"Rank {report.exception_rank}" if report.exception_rank is not None else "The script"
        _flag(report, "python_error", f"{who} raised {_clip(report.exception, 300)}")
    if _lines_around(raw, COLLECTIVE_TIMEOUT, limit=1):
        _flag(report, "collective_timeout", "A collective timed out waiting for other ranks: some rank "
              "skipped, reordered or never reached an all-reduce or all-gather that the others called.")
    if report.nccl:
        _flag(report, "nccl_error", f"NCCL failed ({_clip(report.nccl[0])}); if it names a connection, the "
              "nodes could not reach each other.")
    slurm = "\n".join(report.slurm)
    if "TIME LIMIT" in slurm:
        _flag(report, "slurm_time_limit", "Slurm stopped the job at its time limit: the run hung, or needs a "
              "longer #SBATCH --time.")
    if re.search(r"NODE FAIL|[Nn]ode failure", slurm):
        _flag(report, "slurm_node_fail", "Slurm ended the job because a node failed, not because of your "
              "code: run it again.")
    # A step is cancelled after any task fails; only a cancelled job, or a step cancelled for no
    # reason this file shows, says someone or something (scancel, preemption) stopped the run.
    cancelled = [s for s in report.slurm if "CANCELLED" in s and not re.search(r"TIME LIMIT|NODE FAIL", s)]
    if any("*** JOB" in s for s in cancelled) or (cancelled and not report.exception and not report.oom):
        _flag(report, "slurm_cancelled", f"The job was cancelled before it ended ({cancelled[0]}).")
    if report.oom:
        _flag(report, "oom", f"A process ran out of memory ({_clip(report.oom[0])}).")
