"""Re-run a hand-in's parts at one check: worlds of real gloo ranks, restarted past a failed part.

`run_check` runs every part of the hand-in's `assignment4.py` (beside the trusted `utils.py`) in a
world of the check's size. When a part ends its world (a crash on some ranks, a hang, a dead rank),
that part is recorded and a new world runs the parts after it, so one broken part costs only that
part. The weights come back as tensors, checked for shape and type in grader.rerun.wire.channel.

Everything a rank says passes through grader.rerun.wire.hidden's `Words` into a PartRun: at a hidden
check only an exception's type and the hand-in's own lines are kept. A part whose world timed out,
or whose ranks fell out of step, is described from each rank's collectives (its result, or the
progress record a hung rank left, grader.rerun.rank.hooks): who returned, who waited in which
collective, what the others called instead (grader.rerun.hangs). At a check of several nodes a GPU
index at or above LOCAL_WORLD_SIZE fails the part (`_device_problem`).
"""

import dataclasses
import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grader import kit
from grader.parts import BY_ID, PART_IDS
from grader.rerun import starved
from grader.rerun.wire import bounds, channel, protocol
from grader.rerun.sandbox import memory
from grader.rerun.wire.hidden import Words
from grader.rerun.hangs import collective, hang_detail, part_calls
from grader.rerun.wire.protocol import RankStatus, StopReason, WorldJob, WorldReport
from grader.rerun.sandbox.namespaces import scratch_dir
from grader.results import Status


@dataclass
class RankRun:
    rank: int
    status: str                  # a RankStatus value: ok / not_implemented / crashed / oom / dist_error
    weight: object = None        # float64 tensor, or None
    dtype: str = ""
    exception: str = ""
    traceback: str = ""
    comm: list = field(default_factory=list)   # the rank's own word: it can fail a part, never pass one
    sent: list = field(default_factory=list)   # per call of `comm`, what the rank handed it (float64, flat) or None
    devices: list = field(default_factory=list)  # GPU indices the part asked for
    extra: dict = field(default_factory=dict)   # name -> float64 tensor (a backward check's gradients)
    oversize: int = 0            # the values of a tensor refused for its size (grader.rerun.wire.bounds)


@dataclass
class PartRun:
    """One part at one check: what each rank did, or why the world ended at this part."""
    part: str
    status: Status               # PASSED here only means "every rank returned a weight"
    ranks: dict = field(default_factory=dict)    # rank -> RankRun
    detail: str = ""
    output: str = ""             # what the ranks printed (head and tail), for crashes
    data: object = None          # the protocol.PartSecret the part ran on (grader.rerun.wire.secret)
    starved: bool | None = None  # past the part's clock: whether the CPU was kept from it (grader.rerun.starved);
                                 # None where some rank never took the part up (it is run again alone)


def prepare_code(assignment: Path) -> dict:
    """What a world runs: the hand-in's assignment4.py beside the provided utils.py, nothing else.
    It travels inside the job, so no file of the grader's is ever shared with the world."""
    return {"assignment4.py": Path(assignment).read_bytes().decode("utf-8", "replace"),
            "utils.py": kit.UTILS.read_text()}


def _rank_run(rank: int, result: protocol.Result, words: Words) -> RankRun:
    calls = [c for c in result.comm[:1000] if isinstance(c, dict)]
    run = RankRun(rank=rank, status=result.status.value, comm=[collective(c) for c in calls],
                  sent=[channel.decode_sent(c.get("sent")) for c in calls],
                  devices=[d for d in result.devices[:100] if isinstance(d, int) and not isinstance(d, bool)],
                  oversize=result.oversize)
    run.exception, run.traceback = words.error(result.error)
    if result.status == RankStatus.OK:
        try:
            run.weight = channel.decode_tensor(result.weight)
            run.dtype = str(result.weight.get("dtype", ""))[:20]
            run.extra = {str(name)[:40]: channel.decode_tensor(t) for name, t in list(result.extra.items())[:bounds.EXTRAS]}
        except (channel.ChannelError, AttributeError) as e:
            run.status = "crashed"
            run.exception = "the returned weight could not be read back" + ("" if words.hidden else f" ({e})")
    return run


def _device_problem(ranks: dict, check, words: Words) -> str:
    """On several nodes, a GPU index at or above LOCAL_WORLD_SIZE (the node's GPUs): a device picked
    by the global rank, which CudaOnCpu would otherwise let pass. On a cluster it fails
    ("invalid device ordinal"). The record comes from the rank: it can only fail a part."""
    if check.nodes <= 1:
        return ""
    per_node = check.world_size // check.nodes
    for rank, run in sorted(ranks.items()):
        index = next((i for i in run.devices if i >= per_node), None)
        if index is None:
            continue
        if words.hidden:
            return ("a rank asked for a GPU index at or above its node's number of GPUs (LOCAL_WORLD_SIZE), "
                    "which fails on a cluster of several nodes: pick the device by LOCAL_RANK "
                    "(torch.device('cuda', local_rank)), not by the global rank")
        return (f"rank {rank} asked for cuda:{index} but its node has {per_node} GPU{'s' if per_node > 1 else ''} "
                f"(LOCAL_WORLD_SIZE = {per_node}; its LOCAL_RANK is {rank % per_node}), which fails on a cluster: "
                f"use LOCAL_RANK to pick the device (torch.device('cuda', local_rank)), not the global rank")
    return ""


def _oom_detail(words: Words, memory_mb: int) -> str:
    """What an out-of-memory part is told, the same whichever layer caught it (grader.rerun.sandbox.memory.verdict)."""
    return words.stopped(StopReason.OUT_OF_MEMORY, memory.verdict(memory_mb))


def _completed_part(part: str, results: dict, check, words: Words, memory_mb: int = 0) -> PartRun:
    ranks = {rank: _rank_run(rank, m, words) for rank, m in results.items()}
    statuses = {r.status for r in ranks.values()}
    status = {"ok": Status.PASSED, "not_implemented": Status.NOT_IMPLEMENTED,
              "oom": Status.OOM}.get(statuses.pop() if len(statuses) == 1 else "", Status.CRASHED)
    device = _device_problem(ranks, check, words) if status == Status.PASSED else ""
    if device:
        return PartRun(part=part, status=Status.CRASHED, ranks=ranks, detail=device)
    return PartRun(part=part, status=status, ranks=ranks,
                   detail=_oom_detail(words, memory_mb) if status == Status.OOM else "")


def _output_text(report: WorldReport) -> str:
    return "\n".join(f"--- rank {r} ---\n{t}" for r, t in sorted(report.output.items()) if t.strip())[-12000:]


def _failed_part(part: str, report: WorldReport, words: Words, memory_mb: int = 0, pg_timeout: float = 0.0) -> PartRun:
    """The PartRun of the part at which a world had to end, with the likeliest cause first.
    `pg_timeout`: the process group's timeout, which a rank that says a collective timed out waited."""
    abort = report.abort
    results = report.results.get(part, {})
    ranks = {rank: _rank_run(rank, m, words) for rank, m in results.items()}
    reason, detail = abort.reason, words.stopped(abort.reason, abort.detail)
    crashed = [r for r in sorted(ranks.values(), key=lambda r: r.rank) if r.status == "crashed"]
    waited = [r for r in ranks.values() if r.status == "dist_error"]
    # A collective's failure is the rank's own words, which a hand-in can write: it says the ranks
    # fell out of step only where it came out of a collective the rank called (its record says so),
    # and a timeout only where the rank also waited the process group's timeout out; else it is a
    # crash, whatever it says. Read from its words, which a hidden check does not keep.
    inside = {r.rank for r in waited if r.comm and r.comm[-1].get("raised")}
    timed_out = any(m.error is not None and any(s in m.error.exception.lower() for s in ("timed out", "timeout"))
                    and m.seconds >= 0.8 * pg_timeout for r, m in results.items() if r in inside)
    codes = {r: c for r, c in report.exit_codes.items() if c not in (0, None)}
    output = _output_text(report)
    returned = {r.rank for r in ranks.values() if r.status == "ok"}
    hang = hang_detail(part_calls(part, ranks, report), returned, words)
    if reason == StopReason.OUT_OF_MEMORY:   # the watchdog or the world's cgroup: the cause, whatever the ranks said
        status, detail = Status.OOM, words.stopped(reason, abort.detail or memory.verdict(memory_mb))
    elif reason == StopReason.TIMEOUT and not crashed:   # with one, the others likely waited for it
        status = Status.TIMEOUT
        # who waited for whom first: a line that keeps only its head (the staff report's) keeps the cause
        detail = f"{part} did not finish: {hang}; {detail}" if hang else \
            f"{part} did not finish: {detail} (a hang, or a rank waiting for a collective the others skipped)"
    elif crashed:
        status = Status.CRASHED
        first = crashed[0]
        detail = f"{words.rank(first.rank)} raised {first.exception}"
        if waited:
            detail += "; the other ranks then waited for it in a collective"
    elif any(r.status == "oom" for r in ranks.values()):   # a MemoryError: past RLIMIT_DATA, the world's limit
        status, detail = Status.OOM, _oom_detail(words, memory_mb)
    elif inside and (timed_out or returned):
        status = Status.TIMEOUT
        finished = sorted(returned)
        detail = hang or ("a collective timed out: some rank never joined it" if not finished else
                          f"the ranks fell out of step: {words.ranks(finished, len(ranks))} finished while "
                          f"the others waited in a collective")
        if not hang:
            detail += " (a rank that skips or adds a collective makes the others wait)"
    elif reason == StopReason.RANK_DIED and "std::bad_alloc" in output:   # C++'s own last words (a Python
        # MemoryError is the rank's oom above): output is the hand-in's to write, so only the runtime's text
        status, detail = Status.OOM, _oom_detail(words, memory_mb)
    else:
        status = Status.CRASHED
        if waited:
            detail = f"a collective failed: {waited[0].exception}"
        elif codes and not words.hidden:   # an exit code is the rank's to choose
            detail = f"{detail} (exit codes {codes})"
    return PartRun(part=part, status=status, ranks=ranks, detail=detail, output=words.output(output))


def _world_job(code: dict, work: Path, check, rubric, parts: list, scaled=False) -> WorldJob:
    config = {k: v for k, v in asdict(check).items() if k not in ("name", "hidden", "weight", "world_size")}
    if scaled:   # the ranks change what each moving collective returns (grader.rerun.rank.hooks)
        config["scaled"] = True
        if isinstance(scaled, dict):   # ... where each part's moves lay (grader.verdict.carried.targets), as JSON
            config["targets"] = json.dumps({p: scaled[p] for p in parts if p in scaled})
    return WorldJob(work_dir=str(work), code=code, store=str(work / "store"),
                    world_size=check.world_size, parts=list(parts), check=config,
                    pg_timeout=rubric.timeouts.process_group, limits=asdict(rubric.limits),
                    timeouts=protocol.Timeouts(world_start=rubric.timeouts.world_start, part=rubric.timeouts.part))


def _unstarted_parts(parts: list, report: WorldReport, words: Words, memory_mb: int) -> dict:
    """PartRuns for `parts` of a world that ended before any of them ran (code that does not load),
    or before it could say which was running (its leader or supervisor killed)."""
    abort = report.abort
    status = {StopReason.LOAD_FAILED: Status.CRASHED, StopReason.START_TIMEOUT: Status.TIMEOUT,
              StopReason.TIMEOUT: Status.TIMEOUT, StopReason.OUT_OF_MEMORY: Status.OOM,
              StopReason.INFRA_ERROR: Status.INFRA_ERROR}.get(abort.reason, Status.CRASHED)
    said = words.stopped(abort.reason, abort.detail or (memory.verdict(memory_mb) if status == Status.OOM else ""))
    if abort.reason == StopReason.LOAD_FAILED and abort.error:
        said = words.error(abort.error)[0]
    detail = {StopReason.LOAD_FAILED: f"assignment4.py could not be loaded: {said}",
              StopReason.START_TIMEOUT: f"loading assignment4.py did not finish: {said}",
              }.get(abort.reason, said)
    ranks = {}
    if abort.error:
        exception, traceback = words.error(abort.error)
        ranks = {0: RankRun(rank=0, status="crashed", exception=exception, traceback=traceback)}
    return {part: PartRun(part=part, status=status, detail=detail, output=words.output(_output_text(report)),
                          ranks=ranks)
            for part in parts}


def run_check(executor, code: dict, check, rubric, scratch: Path, parts=PART_IDS, scaled=False,
              deadline: float = None) -> dict:
    """Run `parts` of `code` (prepare_code's) at `check`; return part id -> PartRun, for every part
    that runs at the check's kind (a part of other kinds only is not run: it has no data there).
    `scaled`: in worlds whose ranks change what each moving collective returns (grader.rerun.rank.hooks);
    a dict (part -> grader.verdict.carried.targets) changes, for each part in it, only where its moves lay.
    `deadline`: when the hand-in's time is up (time.monotonic()): no world starts after it, and none
    may wait past it for its start or a part (a hand-in that sleeps as it loads, in every world)."""
    remaining = [p for p in parts if check.kind in BY_ID[p].kinds]
    runs = {}
    words = Words(code, check.hidden)
    config = _world_job(code, scratch, check, rubric, []).check
    while remaining:
        left_s = None if deadline is None else deadline - time.monotonic()
        if left_s is not None and left_s <= 0:
            runs.update({p: PartRun(part=p, status=Status.TIMEOUT, detail=f"not run: the hand-in's "
                                    f"{rubric.timeouts.handin:g} s were used up") for p in remaining})
            break
        work = Path(scratch_dir("world-", scratch))
        within = rubric if left_s is None else dataclasses.replace(rubric, timeouts=dataclasses.replace(
            rubric.timeouts, world_start=min(rubric.timeouts.world_start, left_s),
            part=min(rubric.timeouts.part, left_s)))
        try:
            report = executor.run_world(_world_job(code, work, check, within, remaining, scaled))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for part in report.completed:
            runs[part] = _completed_part(part, report.results[part], check, words, rubric.limits.memory_mb)
            runs[part].data = report.secrets.get(part)
        if report.abort is None:
            break
        left = [p for p in remaining if p not in runs]
        if report.abort.part in left:
            # The part that ended the world failed (a rank that died, or held the most memory, was
            # running it); any before it the world did not settle run again: a rank ahead of the
            # others never fails a part they were still running.
            part = report.abort.part
            runs[part] = _failed_part(part, report, words, rubric.limits.memory_mb, rubric.timeouts.process_group)
            runs[part].data = report.secrets.get(part)
            if report.abort.reason == StopReason.TIMEOUT:   # hung, kept from the CPU, or never taken up?
                late, cpu, unread = runs[report.abort.part], report.abort.cpu, report.abort.unread
                late.starved = None if unread else starved.starved(cpu, rubric.timeouts.part, check.world_size)
                late.detail += f"; {starved.said(cpu)}" + (f"; {words.ranks(unread, check.world_size)} never "
                                                           f"took the part up after the one before" if unread else "")
            remaining = [p for p in left if p not in runs]
            continue
        runs.update(_unstarted_parts(left, report, words, rubric.limits.memory_mb))
        break
    bounds.explain(runs, config, check.hidden, Status.CRASHED)
    return runs
