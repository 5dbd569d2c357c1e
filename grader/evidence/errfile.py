"""A hand-in's `.err` (stderr) as evidence: `parse_err(data) -> ErrReport`, with the first traceback
that is not torchrun's, the failed rank, and what NCCL, Slurm and the out-of-memory killer said.
"""

from __future__ import annotations

import re

from grader.evidence.logtext import (
    CARETS,
    COLLECTIVE_TIMEOUT,
    EXCEPTION_LINE,
    LINE_PREFIX,
    NCCL,
    NEEDLES,
    OOM,
    OOM_KILLED,
    OOM_MEMORY,
    REPORT_LINES,
    ROOT_CAUSE,
    SLURM,
    SLURM_EVENT,
    SYNTAX_ERROR,
    TRACEBACK,
    TRACEBACK_HEAD,
    TRACEBACK_SCAN,
    TRACEBACKS_READ,
    Budget,
    ErrReport,
    LogTimeout,
    add_flag,
    as_bytes,
    clip,
    clip_line,
    cut_flag,
    line_at,
    timeout_flag,
)


def _accepts(pattern: re.Pattern, raw: bytes, m: re.Match, end: int, line: str) -> bool:
    """Whether the line whose first match of `pattern` is `m` is evidence of its kind."""
    if pattern is SLURM:   # Slurm speaks, then says what happened
        return SLURM_EVENT.search(raw, m.end(), end) is not None
    if pattern is OOM:     # "task 3: Killed" and the like: killed, but not said to be for memory
        return OOM_MEMORY.search(raw, m.start(), end) is not None or OOM_KILLED.search(line) is not None
    return True


def _lines_around(raw: bytes, pattern: re.Pattern, limit=REPORT_LINES, budget: Budget = None) -> list[str]:
    """The distinct whole lines (cleaned, clipped) where `pattern` occurs, in order, at most `limit`.
    Each line is looked at once, from its first match: time linear in `raw`, however many matches
    a line holds."""
    found, pos = {}, 0
    if not any(needle in raw for needle in NEEDLES.get(pattern, (b"",))):
        return []
    while len(found) < limit and (m := pattern.search(raw, pos)):
        start, end = line_at(raw, m.start(), m.end())
        pos = end + 1
        line = LINE_PREFIX.sub("", clip_line(raw[start:end]), count=1).strip()
        if _accepts(pattern, raw, m, end, line):
            found[line] = None
        if budget:
            budget.check()
    return list(found)


def _lines_before(raw: bytes, pos: int, prefix: str, n: int) -> list[str]:
    """The last `n` lines before the line at `pos` that carry `prefix`, without it."""
    lines = raw[max(0, pos - 4000):pos].decode("utf-8", "replace").split("\n")[1:-1]
    return [line[len(prefix):].rstrip("\r") for line in lines if line.startswith(prefix)][-n:]


def _first_exception(raw: bytes, budget: Budget = None):
    """(exception line, cleaned head, rank) of the first traceback that is not torchrun's own,
    among the first TRACEBACKS_READ."""
    syntax = SYNTAX_ERROR.search(raw)
    for i, m in enumerate(TRACEBACK.finditer(raw)):
        if (syntax and syntax.start() < m.start()) or i >= TRACEBACKS_READ:
            break
        if budget:
            budget.check()
        lo = max(0, m.start() - 200)   # a prefix is short; a longer one is no traceback of ours
        start = raw.rfind(b"\n", lo, m.start()) + 1 or lo
        prefix = raw[start:m.start()].decode("utf-8", "replace")   # "2: [rank2]: ", "" ...
        rank = LINE_PREFIX.match(prefix).group(1)
        head, exception = ["Traceback (most recent call last):"], None
        for line in raw[m.end():m.end() + TRACEBACK_SCAN].decode("utf-8", "replace").split("\n")[1:]:
            if not line.startswith(prefix):   # another rank's or process's line in between
                continue
            line = clip(line[len(prefix):].rstrip("\r"), 2000)
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
        exception = clip_line(syntax.group(), 2000).strip()
        head = [line for line in _lines_before(raw, start, prefix, 3) if not CARETS.fullmatch(line)]
        return exception, head + [exception], int(rank) if rank else None
    return None, [], None


def parse_err(data: bytes | str) -> ErrReport:
    """What a run's stderr says went wrong: the exception, NCCL, Slurm and out-of-memory evidence."""
    report = ErrReport()
    try:
        raw = as_bytes(data)
        _parse_err(raw, report, Budget())
        cut_flag(report, raw, ".err")
    except LogTimeout:      # this hand-in loses what its .err would show, nobody else waits
        report = ErrReport()
        timeout_flag(report, ".err")
    except Exception as e:  # noqa: BLE001 - evidence only: a parser bug must not end the grading of a batch
        add_flag(report, "parse_error", f"The .err could not be read completely ({e!r}).")
    return report


def _parse_err(raw: bytes, report: ErrReport, budget: Budget) -> None:
    report.exception, report.traceback_head, report.exception_rank = _first_exception(raw, budget)
    if root := ROOT_CAUSE.search(raw):
        report.failed_rank, report.exit_code = int(root.group(1)), int(root.group(2))
    else:
        report.failed_rank = report.exception_rank
    report.nccl, report.slurm, report.oom = (_lines_around(raw, p, budget=budget) for p in (NCCL, SLURM, OOM))

    if report.exception:
        who = f"Rank {report.exception_rank}" if report.exception_rank is not None else "The script"
        add_flag(report, "python_error", f"{who} raised {clip(report.exception, 300)}")
    if _lines_around(raw, COLLECTIVE_TIMEOUT, limit=1, budget=budget):
        add_flag(report, "collective_timeout", "A collective timed out waiting for other ranks: some rank "
              "skipped, reordered or never reached an all-reduce or all-gather that the others called.")
    if report.nccl:
        add_flag(report, "nccl_error", f"NCCL failed ({clip(report.nccl[0])}); if it names a connection, the "
              "nodes could not reach each other.")
    slurm = "\n".join(report.slurm)
    if "TIME LIMIT" in slurm:
        add_flag(report, "slurm_time_limit", "Slurm stopped the job at its time limit: the run hung, or needs a "
              "longer #SBATCH --time.")
    if re.search(r"NODE FAIL|[Nn]ode failure", slurm):
        add_flag(report, "slurm_node_fail", "Slurm ended the job because a node failed, not because of your "
              "code: run it again.")
    # A step is cancelled after any task fails; only a cancelled job, or a step cancelled for no
    # reason this file shows, says someone or something (scancel, preemption) stopped the run.
    cancelled = [s for s in report.slurm if "CANCELLED" in s and not re.search(r"TIME LIMIT|NODE FAIL", s)]
    if any("*** JOB" in s for s in cancelled) or (cancelled and not report.exception and not report.oom):
        add_flag(report, "slurm_cancelled", f"The job was cancelled before it ended ({cancelled[0]}).")
    if report.oom:
        add_flag(report, "oom", f"A process ran out of memory ({clip(report.oom[0])}).")
