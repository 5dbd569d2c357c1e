"""What the .log and .err readers share: every pattern of both files, the reports they return, and
the text helpers. `grader.evidence.logfile` reads a `.log`, `grader.evidence.errfile` an `.err`.

A log is evidence, not the verdict (it can be stale or forged; the grade comes from our re-run).
Clusters mangle output (srun --label and torchrun prefixes, ranks spliced into one line, CRLF,
colour codes, invalid UTF-8, a cut-off last line), so the patterns search the whole text as bytes,
never only line starts. Nothing here raises: a parser failure becomes a `parse_error` flag.

A log is also hostile input, so reading one takes time linear in its size: at most `LOG_BYTES` are
read (its head and its tail, with a `cut` flag), every pattern runs on Python 3.10's `re` without
rescanning text from each occurrence (a quantifier that could run into the next occurrence is
bounded; what must sit on one line with a first match is looked for once per line, from that match),
every line quoted is clipped, and a read past `LOG_SECONDS` gives up its evidence (`log_timeout`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from enum import Enum

from grader import typed
from grader.parts import CORE_PART_IDS, PARTS

# ---- Every pattern of both files, in one place -------------------------------------------------

ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")
# A claim anywhere in the text: "[Prefix][Rank r] Tensors match: True | Max diff: x | Mean diff: y"
# (prefix optional), "[Prefix][Rank r] Not implemented yet: ...", or "[Rank r] done".
# Groups: 1 the claim's text, 2 prefix, 3 rank, 4 True/False, 5 max diff, 6 not implemented, 7 done.
# Ranks and world sizes have at most 4 digits, so that no line can make a report of a million ranks.
CLAIM = re.compile(
    rb"(\[(?:([A-Za-z][\w \-]{0,38})\]\s*\[)?Rank (\d{1,4})\]\s*"
    rb"(?:Tensors match:\s*(True|False)(?:\s*\|\s*Max diff:\s*([\w.+\-]{1,40}))?"
    rb"(?:\s*\|\s*Mean diff:\s*[\w.+\-]{1,40})?(?:\s*\|\s*shapes \[[\d, ]{0,80}\] vs \[[\d, ]{0,80}\])?"
    rb"|(Not implemented)[^\r\n\[]{0,160}|(done)\b(?![ \t]*[A-Za-z])))")
# "[Distributed Init] Rank r initialized on ...": ours (groups 2-8: node, host, device, backend,
# world size, torch, code sha256) or the handout's "... on {node_id} on GPU {local_rank}." (9, 10).
INIT = re.compile(
    rb"\[Distributed Init\]\s*Rank (\d{1,4}) initialized on (?:node (\S{1,200}) \(([^)\r\n]{0,200})\) on "
    rb"(\S{1,200}) \| backend (\w{1,40}) \| world size (\d{1,4})(?: \| torch (\S{1,80}))?"
    rb"(?: \| code sha256 (\w{1,64}))?|(\S{1,200}) on GPU (\d{1,4}))")
JOB = re.compile(rb"\[Job\] ([^\r\n]*)")               # slurm/common.sh: header and footer lines
# What only a Slurm job writes: its id in a job script's own lines ("SLURM_JOB_ID=48187"), and the
# lines clusters' job scripts open with ("[sbatch-master] ...", "[srun] rank=0 host=node1 ...").
SLURM_MARK = re.compile(rb"SLURM_JOB_ID=(\d+)|\[(?:srun|sbatch[\w-]*)\]")
SRUN = b"[srun]"                                          # then, on the same line, the host:
SRUN_HOST = re.compile(rb"\bhost=([\w.-]{1,200})")
SLURM_JOB_ID = re.compile(r"\d+(?:_\d+)?")             # "48187", an array task's "48187_3"
JOB_STATUS = re.compile(rb"finished status=(-?\w+)")
KEY_VALUE = re.compile(r"\b(\w{1,60})=(\S{0,200})")
# Invented prefixes, by keyword (each part's `aliases`), tried after the exact prefixes of
# grader.parts in the order of the parts' `alias_rank`.
PREFIX_KEYWORDS = tuple((p.id, p.aliases) for p in sorted(PARTS, key=lambda p: p.alias_rank) if p.aliases)

TRACEBACK = re.compile(rb"Traceback \(most recent call last\):")
SYNTAX_ERROR = re.compile(rb"(?:SyntaxError|IndentationError|TabError): [^\r\n]*")  # no "Traceback" line
LINE_PREFIX = re.compile(r"^[ \t]*(?:\d+: ?)?(?:\[(?:rank|default)(\d+)\]: ?)?")  # srun --label, torchrun
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?::|$)")              # "ValueError: ...", "KeyboardInterrupt"
CARETS = re.compile(r"[ \t]*[\^~]+[ \t]*")
ROOT_CAUSE = re.compile(rb"Root Cause \(first observed failure\):[\s\S]{0,400}?rank\s{0,20}:\s{0,20}(\d{1,6})"
                        rb"[\s\S]{0,200}?exitcode\s{0,20}:\s{0,20}(-?\d{1,6})")
NCCL = re.compile(rb"NCCL error|nccl[A-Z]\w{0,60}Error|Watchdog caught collective operation timeout")
# Slurm's lines: who speaks ("srun: ", "slurmstepd-node3: "), then, later on the same line, what happened.
SLURM = re.compile(rb"(?:slurmstepd|srun)\S{0,60}: ")
SLURM_EVENT = re.compile(rb"CANCELLED|TIME LIMIT|[Nn]ode failure|NODE FAIL|PREEMPT|[Aa]borted|"
                         rb"Exited with exit code|Out Of Memory")
OOM = re.compile(rb"out of memory|Out Of Memory|OutOfMemoryError|oom[_-]kill|MemoryError|Killed")
OOM_MEMORY = re.compile(rb"out of memory|Out Of Memory|OutOfMemoryError|oom[_-]kill|MemoryError")
OOM_KILLED = re.compile(r"^Killed$|\d Killed\b")   # "Killed" alone, or bash's "line 9: 4711 Killed  ..."
COLLECTIVE_TIMEOUT = re.compile(rb"Watchdog caught collective operation timeout|Timed out waiting \d+ ?ms")
# Literals one of which every match of an .err pattern contains: a file without any of them skips
# the pattern (alternations search slowly, and a long .err of NCCL_DEBUG output is common).
NEEDLES = {NCCL: (b"NCCL", b"nccl", b"Watchdog"), SLURM: (b"slurmstepd", b"srun"),
           OOM: (b"emory", b"oom", b"Killed"), COLLECTIVE_TIMEOUT: (b"Watchdog", b"Timed out")}

# The parts the handout's run logs unprefixed on rank 0, in this order (each part's `handout_log`)
HANDOUT_RANK0_PARTS = tuple(p.id for p in PARTS if p.handout_log)
EXCERPT_LINES = 8      # claim lines quoted per part
REPORT_LINES = 10      # lines kept per kind of .err evidence
TRACEBACK_HEAD = 15    # cleaned lines kept of a traceback, its exception line the last
TRACEBACK_SCAN = 64_000  # bytes read after "Traceback (...)" to find its exception
TRACEBACKS_READ = 64     # tracebacks looked at for the first one that is not torchrun's
LINE_CHARS = 300         # characters kept of any line quoted from a log
LOG_BYTES = 8 << 20      # bytes read of a log: its first and its last half of this
LOG_SECONDS = 20.0       # a read that takes longer gives up the log's evidence
CUT_MARK = b"\n[... the middle of this file was not read ...]\n"


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


class _Result:
    def to_dict(self) -> dict:
        return typed.plain(self, finite=True)

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
    claims_of: str = ""                # the code sha256 whose run's lines the parts hold ("": all)
    hosts: dict[int, str] = field(default_factory=dict)        # rank -> host (ours) or node id (handout's)
    backends: list[str] = field(default_factory=list)          # distinct backends of the init lines
    job: dict[str, str] = field(default_factory=dict)          # [Job] header and footer fields
    nodes: int | None = None         # distinct hosts of the ranks (or the [Job] header's nnodes)
    slurm: str = ""                  # what shows the run was a Slurm job ("" when nothing does)
    finished: bool = False           # every rank printed done, and the footer (if any) says status=0
    parts: dict[str, PartEvidence] = field(default_factory=lambda: {p: PartEvidence(p) for p in CORE_PART_IDS})
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

class LogTimeout(Exception):
    """Reading a log took longer than LOG_SECONDS."""


class Budget:
    """The time one log read may take: `check()` between steps raises LogTimeout past it."""

    def __init__(self, seconds: float = None):
        self.deadline = time.monotonic() + (LOG_SECONDS if seconds is None else seconds)

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise LogTimeout()


def read_log(path) -> bytes:
    """A log file's bytes: all of it up to LOG_BYTES, else its head and tail around CUT_MARK (the
    job's header and footer and the last lines of every rank are at the ends)."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(0)
        if size <= LOG_BYTES:
            return f.read(LOG_BYTES)
        head = f.read(LOG_BYTES // 2)
        f.seek(size - LOG_BYTES // 2)
        return head + CUT_MARK + f.read(LOG_BYTES // 2)


def as_bytes(data) -> bytes:
    """The text as bytes, colour codes removed, cut to LOG_BYTES around CUT_MARK as `read_log` cuts
    files; b"" when there is nothing but whitespace."""
    data = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data or b"")
    if len(data) > LOG_BYTES + len(CUT_MARK):
        data = data[:LOG_BYTES // 2] + CUT_MARK + data[-(LOG_BYTES // 2):]
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):   # saved as UTF-16 by an editor
        data = data.decode("utf-16", "replace").encode("utf-8", "replace")
    if not data or data.isspace():
        return b""
    return ANSI.sub(b"", data) if b"\x1b" in data else data


def squash(b: bytes) -> str:
    return " ".join(b.decode("utf-8", "replace").split())


def ranks_text(ranks) -> str:
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


def number(b: bytes) -> float | None:
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


def add_flag(report, code: str, message: str) -> None:
    report.flags.append(LogFlag(code, clip(message, 2000)))


def cut_flag(report, raw: bytes, what: str) -> None:
    """Say so when only the head and tail of the file were read."""
    if CUT_MARK in raw:
        add_flag(report, "cut", f"The {what} is longer than {LOG_BYTES >> 20} MB: only its first and last "
                 f"{LOG_BYTES >> 21} MB were read.")


def timeout_flag(report, what: str) -> None:
    add_flag(report, "log_timeout", f"Reading the {what} took longer than {LOG_SECONDS:.0f} s; its evidence "
             "was not used.")


def line_at(raw: bytes, start: int, end: int) -> tuple:
    """(first, past the last) byte of the line that holds raw[start:end]."""
    first = raw.rfind(b"\n", 0, start) + 1
    last = raw.find(b"\n", end)
    return first, len(raw) if last < 0 else last


def clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n - 3].rstrip() + "..."


def clip_line(b: bytes, n: int = LINE_CHARS) -> str:
    """A line quoted from a log: decoded, at most `n` characters, "... (cut)" when it was longer."""
    text = b[:4 * n].decode("utf-8", "replace")
    return text if len(text) <= n and len(b) <= 4 * n else text[:n] + "... (cut)"


def nodes_disagree(hosts: set, named: set, printed: set, header_n) -> str:
    """Why the init lines' hosts, hosts printed as "[srun] ... host=" and the header's nnodes do not
    agree ("" when they do)."""
    if header_n is not None and len(hosts) > header_n:
        return f"the job header says nnodes={header_n}, the init lines name {len(hosts)} hosts"
    if header_n is not None and len(printed) > header_n:
        return f"the job header says nnodes={header_n}, '[srun] ... host=' lines name {len(printed)} hosts"
    if printed and hosts and (len(printed) != len(hosts)
                              or not {h.split('.')[0] for h in named} <= {h.split('.')[0] for h in printed}):
        return (f"'[srun] ... host=' lines name {', '.join(sorted(printed)[:4])}, the init lines "
                f"{', '.join(sorted(hosts)[:4])}")
    return ""


def srun_hosts(raw: bytes) -> set:
    """The hosts of "[srun] rank=0 host=node1 ..." lines: the first host= after each "[srun]" of a
    line, each line split once."""
    hosts, pos = set(), 0
    while (at := raw.find(SRUN, pos)) >= 0:
        start, end = line_at(raw, at, at)
        for stretch in raw[at:end].split(SRUN)[1:]:
            if m := SRUN_HOST.search(stretch):
                hosts.add(m.group(1).decode("utf-8", "replace"))
        pos = end + 1
    return hosts
