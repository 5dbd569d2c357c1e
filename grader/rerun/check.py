"""Re-run a hand-in's parts at one check: worlds of real gloo ranks, restarted past a failed part.

`run_check` runs every part of the hand-in's `assignment4.py` (beside the trusted `utils.py`) in
a world of the check's size. When a part ends its world (a crash on some ranks, a hang, a dead
rank), that part is recorded as such and a new world runs the parts after it, so one broken part
costs only that part. The weights come back as tensors, checked for shape and type in
grader.rerun.channel; judging them is grader.pipeline.compare's job.
"""

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grader import kit
from grader.parts import PART_IDS
from grader.rerun import channel, protocol
from grader.rerun.protocol import RankStatus, StopReason, WorldJob, WorldReport
from grader.rerun.sandbox import scratch_dir
from grader.results import Status


@dataclass
class RankRun:
    rank: int
    status: str                  # a RankStatus value: ok / not_implemented / crashed / oom / dist_error
    weight: object = None        # float64 tensor, or None
    dtype: str = ""
    exception: str = ""
    traceback: str = ""
    comm: list = field(default_factory=list)
    answer_key_calls: int = 0
    extra: dict = field(default_factory=dict)   # name -> float64 tensor (a backward check's gradients)


@dataclass
class PartRun:
    """One part at one check: what each rank did, or why the world ended at this part."""
    part: str
    status: Status               # PASSED here only means "every rank returned a weight"
    ranks: dict = field(default_factory=dict)    # rank -> RankRun
    detail: str = ""
    output: str = ""             # what the ranks printed (head and tail), for crashes


def prepare_code(assignment: Path) -> dict:
    """What a world runs: the hand-in's assignment4.py beside the provided utils.py, nothing else.
    It travels inside the job, so no file of the grader's is ever shared with the world."""
    return {"assignment4.py": Path(assignment).read_bytes().decode("utf-8", "replace"),
            "utils.py": kit.UTILS.read_text()}


def _rank_run(rank: int, result: protocol.Result) -> RankRun:
    run = RankRun(rank=rank, status=result.status.value, comm=[c for c in result.comm if isinstance(c, dict)][:1000],
                  answer_key_calls=result.answer_key_calls)
    error = result.error or protocol.ErrorInfo()
    run.exception = error.exception[:2000]
    run.traceback = error.traceback[-6000:]
    if result.status == RankStatus.OK:
        try:
            run.weight = channel.decode_tensor(result.weight)
            run.dtype = str(result.weight.get("dtype", ""))[:20]
            run.extra = {str(name)[:40]: channel.decode_tensor(t) for name, t in list(result.extra.items())[:8]}
        except (channel.ChannelError, AttributeError) as e:
            run.status, run.exception = "crashed", f"the returned weight could not be read back ({e})"
    return run


def _completed_part(part: str, results: dict) -> PartRun:
    ranks = {rank: _rank_run(rank, m) for rank, m in results.items()}
    statuses = {r.status for r in ranks.values()}
    status = {"ok": Status.PASSED, "not_implemented": Status.NOT_IMPLEMENTED,
              "oom": Status.OOM}.get(statuses.pop() if len(statuses) == 1 else "", Status.CRASHED)
    return PartRun(part=part, status=status, ranks=ranks)


def _output_text(report: WorldReport) -> str:
    chunks = [f"--- rank {r} ---\n{text}" for r, text in sorted(report.output.items()) if text.strip()]
    return "\n".join(chunks)[-12000:]


def _failed_part(part: str, report: WorldReport) -> PartRun:
    """The PartRun of the part at which a world had to end, with the likeliest cause first."""
    abort = report.abort
    ranks = {rank: _rank_run(rank, m) for rank, m in report.results.get(part, {}).items()}
    reason, detail = abort.reason, abort.detail
    crashed = [r for r in sorted(ranks.values(), key=lambda r: r.rank) if r.status == "crashed"]
    waited = [r for r in ranks.values() if r.status == "dist_error"]
    timed_out = any("timed out" in r.exception.lower() or "timeout" in r.exception.lower() for r in waited)
    codes = {r: c for r, c in report.exit_codes.items() if c not in (0, None)}
    output = _output_text(report)
    if reason == StopReason.TIMEOUT:
        status = Status.TIMEOUT
        detail = f"{part} did not finish: {detail} (a hang, or a rank waiting for a collective the others skipped)"
    elif crashed:
        status = Status.CRASHED
        first = crashed[0]
        detail = f"rank {first.rank} raised {first.exception}"
        if waited:
            detail += "; the other ranks then waited for it in a collective"
    elif any(r.status == "oom" for r in ranks.values()):
        status, detail = Status.OOM, "a rank ran out of memory"
    elif waited and (timed_out or any(r.status == "ok" for r in ranks.values())):
        status = Status.TIMEOUT
        finished = sorted(r.rank for r in ranks.values() if r.status == "ok")
        detail = ("a collective timed out: some rank never joined it" if not finished else
                  f"the ranks fell out of step: rank{'s' if len(finished) > 1 else ''} "
                  f"{', '.join(map(str, finished))} finished while the others waited in a collective")
        detail += " (a rank that skips or adds a collective makes the others wait)"
    elif reason == StopReason.RANK_DIED and "MemoryError: the ranks and their children" in output:
        status = Status.OOM   # the world's memory watchdog (grader.rerun.memory) ended it
        detail = "out of memory: " + output.split("MemoryError: ", 1)[1].split("\n", 1)[0]
    elif reason == StopReason.RANK_DIED and any(s in output for s in ("MemoryError", "bad_alloc", "allocate memory")):
        status, detail = Status.OOM, f"{detail}: out of memory"
    else:
        status = Status.CRASHED
        if waited:
            detail = f"a collective failed: {waited[0].exception}"
        elif codes:
            detail = f"{detail} (exit codes {codes})"
    return PartRun(part=part, status=status, ranks=ranks, detail=detail, output=output)


def _world_job(code: dict, work: Path, check, rubric, parts: list) -> WorldJob:
    config = {k: v for k, v in asdict(check).items() if k not in ("name", "hidden", "weight", "world_size", "kind")}
    config["backward"] = int(check.kind == "backward")
    return WorldJob(work_dir=str(work), code=code, store=str(work / "store"),
                    world_size=check.world_size, parts=list(parts), check=config,
                    pg_timeout=rubric.timeouts.process_group, limits=asdict(rubric.limits),
                    timeouts=protocol.Timeouts(world_start=rubric.timeouts.world_start, part=rubric.timeouts.part))


def _unstarted_parts(parts: list, report: WorldReport) -> dict:
    """PartRuns for `parts` of a world that ended before any of them ran (code that does not load)."""
    abort = report.abort
    status = {StopReason.LOAD_FAILED: Status.CRASHED, StopReason.START_TIMEOUT: Status.TIMEOUT,
              StopReason.INFRA_ERROR: Status.INFRA_ERROR}.get(abort.reason, Status.CRASHED)
    detail = {StopReason.LOAD_FAILED: f"assignment4.py could not be loaded: {abort.detail}",
              StopReason.START_TIMEOUT: f"loading assignment4.py did not finish: {abort.detail}",
              }.get(abort.reason, abort.detail)
    ranks = {}
    if abort.error:
        ranks = {0: RankRun(rank=0, status="crashed", exception=abort.error.exception[:2000],
                            traceback=abort.error.traceback[-6000:])}
    return {part: PartRun(part=part, status=status, detail=detail, output=_output_text(report), ranks=ranks)
            for part in parts}


def run_check(executor, code: dict, check, rubric, scratch: Path, parts=PART_IDS) -> dict:
    """Run `parts` of `code` (prepare_code's) at `check`; return part id -> PartRun, for every part."""
    remaining = list(parts)
    runs = {}
    while remaining:
        work = Path(scratch_dir("world-", scratch))
        try:
            report = executor.run_world(_world_job(code, work, check, rubric, remaining))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for part in report.completed:
            runs[part] = _completed_part(part, report.results[part])
        if report.abort is None:
            break
        left = [p for p in remaining if p not in runs]
        if report.abort.part in left:
            # The part that ended the world, and any before it the world did not settle, failed.
            ended_at = left.index(report.abort.part)
            for part in left[:ended_at + 1]:
                runs[part] = _failed_part(part, report)
            remaining = left[ended_at + 1:]
            continue
        runs.update(_unstarted_parts(left, report))
        break
    return runs
