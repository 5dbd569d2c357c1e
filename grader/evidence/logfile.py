"""A hand-in's `.log` (stdout) as evidence: `parse_log(data, min_world_size=4) -> LogReport`, with
the init lines, every part on every rank, and the job's footer.

Two dialects reach us. This kit's (a4): every part logs "[Prefix][Rank r] Tensors match: ..." on
every rank, and passes when ranks 0..world_size-1 all claim True. The original handout's: the
baseline and accumulation comparisons have no prefix and come from rank 0 only (the first is the
baseline, the second the accumulation); that baseline compares the initial weight with the updated
one, so "False" with a max diff > 0 is its passing outcome. Prefixes students invent
("[TensorParallel]", "[GradAccum]") are matched to parts by keyword.
"""

from __future__ import annotations

import math
from bisect import bisect
from collections import Counter

from grader.evidence.logtext import (
    CLAIM,
    EXCERPT_LINES,
    HANDOUT_RANK0_PARTS,
    INIT,
    JOB,
    JOB_STATUS,
    KEY_VALUE,
    LINE_CHARS,
    SLURM_JOB_ID,
    SLURM_MARK,
    Budget,
    Dialect,
    LogReport,
    LogTimeout,
    PartEvidence,
    RankClaim,
    add_flag,
    as_bytes,
    clip,
    cut_flag,
    nodes_disagree,
    number,
    part_of_prefix,
    ranks_text,
    squash,
    srun_hosts,
    timeout_flag,
)
from grader.parts import BY_ID, CHANGED, PART_IDS

JOB_FIELDS = 40   # [Job] fields kept, and prefixes naming no part: a log cannot fill a report


def _claims_by_part(comparisons):
    """{part: {rank: [{(kind, changed)}, largest max diff, [excerpts]]}}, the parts that unprefixed
    (handout) comparisons claim, and the prefixes that name no part. kind is "True", "False" or
    "NI" (not implemented); changed says the max diff is not 0 (the handout's baseline needs that)."""
    per, unknown, prefixed = {p: {} for p in PART_IDS}, {}, set()

    def add(part, c):
        diff = number(c[4]) if c[4] else None
        agg = per[part].get(int(c[2]))
        if agg is None:
            agg = per[part][int(c[2])] = [set(), None, []]
        agg[0].add(("NI" if c[5] else c[3].decode(), diff != 0))
        if diff is not None and not math.isnan(diff):
            agg[1] = diff if agg[1] is None else max(agg[1], diff)
        if len(agg[2]) < 2 and (text := clip(squash(c[0]), LINE_CHARS)) not in agg[2]:
            agg[2].append(text)

    for c in dict.fromkeys(comparisons):   # a long log repeats itself: aggregate before Python work
        if c[1] and (part := part_of_prefix(c[1])):
            prefixed.add(part)
            add(part, c)
        elif c[1] and len(unknown) < JOB_FIELDS:
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
        ev.message = f"matches on all {len(ranks)} ranks" if len(ranks) > 1 else f"matches on {ranks_text(ranks)}"
        if handout_baseline and ev.max_diff:
            ev.message = (f"the step changed the weight on {ranks_text(ranks)} (max diff {ev.max_diff:.1e}), "
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
                said.append(f"{ranks_text(bad)}: Tensors match: True, so the step did not change the weight")
            else:
                said.append(f"{ranks_text(bad)}: Tensors match: False"
                            + (f" (max diff {worst:.1e})" if worst is not None else ""))
        if RankClaim.CONFLICTING in by:
            said.append(f"{ranks_text(by[RankClaim.CONFLICTING])}: conflicting lines (several runs in one log?)")
        if RankClaim.NOT_IMPLEMENTED in by:
            said.append(f"{ranks_text(by[RankClaim.NOT_IMPLEMENTED])}: not implemented")
        if RankClaim.MISSING in by:
            said.append(f"no line for {ranks_text(by[RankClaim.MISSING])}")
        ev.message = "; ".join(said)
    return ev


def parse_log(data: bytes | str, min_world_size: int | None = None, code_sha256: str = "") -> LogReport:
    """What a run's stdout claims: dialect, world size, every part on every rank, and flags. With
    `code_sha256` among the log's fingerprints, only the run of that code counts (`_own_run`)."""
    report = LogReport()
    try:
        _parse_log(data, min_world_size, report, Budget(), code_sha256)
    except LogTimeout:      # this hand-in loses its log's evidence, nobody else waits
        report = LogReport()
        timeout_flag(report, "log")
    except Exception as e:  # noqa: BLE001 - evidence only: a parser bug must not end the grading of a batch
        add_flag(report, "parse_error", f"The log could not be read completely ({e!r}).")
    return report


def _parse_log(data, min_world_size, report: LogReport, budget: Budget, code: str) -> None:
    raw = as_bytes(data)
    if not raw:
        return add_flag(report, "empty", "The log is empty: hand in the .log file of a complete run.")
    cut_flag(report, raw, "log")
    head = raw[:65536]
    if sum(head.count(bytes([c])) for c in range(32) if c not in (9, 10, 13)) > len(head) // 10:
        add_flag(report, "binary", "The log is not text: hand in the .log file the job wrote.")
    claims, inits, job_lines = CLAIM.findall(raw), INIT.findall(raw), JOB.findall(raw)
    budget.check()
    report.init_ranks = [int(t[0]) for t in inits]
    report.fingerprints = list(dict.fromkeys(t[7].decode() for t in inits if t[7]))
    dropped = []
    if code and code in report.fingerprints:   # the lines of the run of this code, and its [Job] lines
        report.claims_of = code
        claims, dropped, inits, job_lines = _own_run(raw, code.encode())
        budget.check()

    for line in dict.fromkeys(job_lines):   # header and footer; a later run's values win
        for key, value in KEY_VALUE.findall(line.decode("utf-8", "replace")):
            if key in report.job or len(report.job) < JOB_FIELDS:
                report.job[key] = value
    statuses = [m.group(1).decode() for line in job_lines if (m := JOB_STATUS.match(line))]
    footer_missing = sum(1 for line in job_lines if line.startswith(b"id=")) > len(statuses)
    header_ws = int(report.job["world_size"]) if report.job.get("world_size", "").isdigit() else None
    report.done_ranks = [int(c[2]) for c in claims if c[6]]
    report.hosts = {int(t[0]): (t[2] or t[8]).decode("utf-8", "replace") for t in inits}
    budget.check()
    report.backends = list(dict.fromkeys(t[4].decode() for t in inits if t[4]))
    _origin(raw, report, inits)
    comparisons = [c for c in claims if not c[6]]
    per, unprefixed, report.unknown_prefixes = _claims_by_part(comparisons)
    budget.check()

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
        if BY_ID[p].optional and not per[p]:
            report.parts.pop(p, None)   # an optional part the run never reached: no evidence either way
            continue
        handout = p in unprefixed or (report.dialect is Dialect.HANDOUT and p in HANDOUT_RANK0_PARTS)
        changed = handout and BY_ID[p].handout_log == CHANGED   # initial vs updated weight: must differ
        report.parts[p] = _judge(p, per[p], [0] if handout else everyone, changed)
    _log_flags(report, inits, stated, header_ws, min_world_size, statuses, footer_missing,
               evidence=bool(inits or claims or job_lines))
    if dropped:
        _other_code(report, dropped, code)


def _own_run(raw: bytes, code: bytes) -> tuple:
    """(claims, claims dropped, init lines, [Job] lines) of the runs of `code` in the log. A rank's
    line belongs to the run that rank's last init line before it opened (ranks' lines interleave,
    each rank's in order), until another job's header ("[Job] id=") or the rank's done ends it; a
    [Job] line to the job whose header it follows."""
    opened, inits, own_jobs = {}, [], set()
    for m in INIT.finditer(raw):
        at = opened.setdefault(int(m.group(1)), ([], []))
        at[0].append(m.start())
        at[1].append(m.group(8) == code)
        if m.group(8) == code:
            inits.append(m.groups())
            own_jobs.add(m.start())
    job_lines = [(m.start(), m.group(1)) for m in JOB.finditer(raw)]
    headers = [at for at, line in job_lines if line.startswith(b"id=")]
    own_jobs = {bisect(headers, at) for at in own_jobs}
    jobs = [line for at, line in job_lines if bisect(headers, at) in own_jobs]
    claims, dropped, ended = [], [], {}   # ended: rank -> the init line whose run its done closed
    for m in CLAIM.finditer(raw):
        pos, own = opened.get(rank := int(m.group(3)), ((), ()))
        i = bisect(pos, m.start()) - 1
        live = i >= 0 and own[i] and bisect(headers, pos[i]) == bisect(headers, m.start()) and ended.get(rank) != i
        (claims if live else dropped).append(m.groups())
        ended[rank] = i if i >= 0 and m.group(7) else ended.get(rank)
    return claims, dropped, inits, jobs


def _other_code(report: LogReport, dropped, code: str) -> None:
    """Say which parts' lines came from a run of other code (or from no run's init line)."""
    prefixes = list(dict.fromkeys(c[1].decode("utf-8", "replace") for c in dropped if c[1] and not c[6]))
    for p in {part_of_prefix(x) for x in prefixes} - {None}:
        if p in report.parts and not report.parts[p].passed:
            report.parts[p].message += " (its lines from a run of other code in this log do not count)"
    said = ", ".join(f"[{x}]" for x in prefixes[:6]) or "'done'"
    add_flag(report, "other_code_lines", f"Lines of this log ({said}) come from a run of other code than the "
             f"assignment4.py handed in (another code sha256, or none, on their rank's init line): they earn "
             f"nothing; only the lines of the run of this code (code sha256 {code[:12]}...) count.")


def _origin(raw: bytes, report: LogReport, inits) -> None:
    """How many nodes the run had, and what shows it was a Slurm job: read from the job's own lines
    (the [Job] header; without one, the lines a cluster's job script prints before any rank's line),
    never from what the code printed: a header that says local (or nnodes=1) stands, and hosts named
    elsewhere must agree with it and with the init lines' hosts, or no node count is given."""
    hosts = {(t[2] or t[8]).decode("utf-8", "replace") for t in inits} - {"N/A", "", "None"}
    named = {t[2].decode("utf-8", "replace") for t in inits if t[2]} - {"N/A", "None"}
    printed, nnodes, job_id = srun_hosts(raw), report.job.get("nnodes", ""), report.job.get("id", "")
    header_n = int(nnodes) if nnodes.isdigit() else None
    if problem := nodes_disagree(hosts, named, printed, header_n):
        add_flag(report, "nodes_mismatch", f"The log disagrees with itself on the run's nodes ({problem}): its "
                 "node count is not taken as evidence.")
    else:
        report.nodes = len(hosts) if hosts else len(printed) if printed else header_n
    first = raw.find(b"Rank ")   # the first rank's line: an init line or a claim
    script = b"" if report.job or problem else raw[:first if first >= 0 else len(raw)]   # the job script's
    mark = SLURM_MARK.search(script) if b"SLURM_JOB_ID=" in script or b"[s" in script else None
    if SLURM_JOB_ID.fullmatch(job_id):
        report.slurm = f"Slurm job {job_id}"
    elif job_id.startswith("local") or header_n == 1:
        return   # the job script said so: nothing the code printed overrides it
    elif mark:
        report.slurm = f"Slurm job {mark.group(1).decode()}" if mark.group(1) else "the job script's own lines"
    elif any((t[1] or t[8]).isdigit() for t in inits):
        report.slurm = "Slurm's node ids on the init lines"


def _log_flags(report, inits, stated, header_ws, min_ws, statuses, footer_missing, evidence):
    ws, init_counts, done = report.world_size, Counter(report.init_ranks), set(report.done_ranks)
    handout_nodes = {t[8] for t in inits if t[8]}
    if (sum(1 for t in inits if t[0] == b"0" and t[5] == b"1") > 1
            or (not stated and len(inits) > 1 and set(init_counts) == {0}
                and (len(handout_nodes) > 1 or (header_ws or 0) > 1))):
        add_flag(report, "separate_worlds", f"{len(inits)} processes each started as rank 0 of a world of their "
              "own: start torchrun on every node with the first node of the job as rendezvous, not localhost.")
    if not inits:
        add_flag(report, "no_init_lines", "The log has no '[Distributed Init]' line: it is not the output of a "
              "run of assignment4.py, or the run failed before its process group started.")
    if min_ws and ws and ws < min_ws:
        add_flag(report, "world_size_too_small", f"The run had a world size of {ws}, the assignment needs at "
              f"least {min_ws}: run the job on all its nodes and GPUs.")
    if header_ws and ws and header_ws != ws:
        add_flag(report, "header_mismatch", f"The job header says world_size={header_ws} but the ranks say {ws}.")
    if twice := [r for r, n in init_counts.items() if n > 1]:
        add_flag(report, "duplicate_ranks", f"{ranks_text(twice).capitalize()} started more than once: the log holds "
              "several runs (or separate worlds); hand in the log of one run.")
    missing = []
    if inits and ws and (absent := [r for r in range(ws) if r not in init_counts]):
        missing.append(f"no init line from {ranks_text(absent)}")
    if inits and done and ws and (absent := [r for r in range(ws) if r not in done]):
        missing.append(f"no 'done' from {ranks_text(absent)}")
    for p, ev in report.parts.items():
        absent = [r for r, c in ev.ranks.items() if c is RankClaim.MISSING]
        if absent and len(absent) < len(ev.ranks):
            missing.append(f"no {BY_ID[p].log_prefix} line from {ranks_text(absent)}")
    if missing:
        add_flag(report, "missing_ranks", "Some ranks are silent where others spoke (" + "; ".join(missing)
              + "): a rank crashed or hung, or its output is missing from this log.")
    not_done = [r for r in range(ws or 0) if r not in done]
    failed = [s for s in statuses if s != "0"]
    report.finished = bool(ws) and not not_done and not footer_missing and not failed
    why = [f"{ranks_text(not_done)} never printed 'done'"] if not_done else [] if ws else ["no rank printed 'done'"]
    if footer_missing:
        why.append("the job footer is missing (time limit or cancelled?)")
    if evidence and why:
        add_flag(report, "unfinished", f"The run did not finish: {' and '.join(why)}; see the .err file.")
    if failed:
        add_flag(report, "job_failed", f"The job ended with status {failed[-1]}: torchrun failed, see the .err "
              "file.")
    if len(report.fingerprints) > 1:
        add_flag(report, "mixed_fingerprints", f"The log holds runs of {len(report.fingerprints)} versions of the "
              "code (their code sha256 differ): hand in the log of one run of the code you submit.")
    if report.unknown_prefixes:
        add_flag(report, "unknown_prefix", "Comparison lines whose prefix names no part ("
              + ", ".join(f"[{p}]" for p in report.unknown_prefixes[:5]) + "): use the handout's prefixes.")
