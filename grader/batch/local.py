"""Grade hand-ins on this machine: `jobs` at once, each with its own executor, the canary first.

Before grading, the reference solution is re-run at every check through the same machinery (the
canary, grader.pipeline.canary), and its outcome kept in OUT/canary.json (grader.results.ungradable
reads it). If it does not pass, nothing can be trusted: every hand-in is recorded `infra_error` with
the canary's cause (the reference is wrong, the rubric's limits are too small for it, or the machine
cannot run a world) and its fix, and no score is written. A crash while grading one hand-in becomes that hand-in's result; the batch
goes on. Every hand-in's files are written by the pipeline as soon as it is graded
(grader.pipeline.record); this module collects only each one's status. Every world of a batch runs on
the data of OUT's data key (OUT/.data-key, grader.rerun.wire.secret), so the same code gives the same
weight in every hand-in and every regrade into OUT.
"""

import os
import queue
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from grader import kit
from grader.batch.progress import Progress
from grader.limits import Jobs, default_jobs, read_machine
from grader.pipeline.canary import canary
from grader.pipeline.record import grade_into, infra_into
from grader.rerun.wire import secret
from grader.rerun.executors import make_executor
from grader.rerun.sandbox.namespaces import scratch_dir
from grader.results import Cause, Status, write_canary


DATA_KEY = ".data-key"


def data_key(out: Path) -> bytes:
    """The batch's data key (grader.rerun.wire.secret): OUT/.data-key, made on the first `grade` into
    OUT (hex, readable by its owner alone) and read by every later one, and by every array task,
    so regrades and later hand-ins run on the same data."""
    path = Path(out) / DATA_KEY
    if not path.exists():
        fresh = path.with_name(f"{DATA_KEY}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secret.new_key().hex().encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(fresh, path)   # whole or not at all; the first of two at once wins
        except FileExistsError:
            pass
        finally:
            os.unlink(fresh)
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != secret.KEY_BYTES:
        raise ValueError(f"{path} is not a data key ({2 * secret.KEY_BYTES} hex digits); delete it to start "
                         f"a new one (the batch's data then changes)")
    return key


def batch_jobs(jobs, rubric) -> Jobs:
    """`jobs` as given, else as many as this machine holds for the rubric's largest world at its
    limits.memory_mb (grader.limits.default_jobs), with the line that says why."""
    if jobs is not None:
        return Jobs(jobs, f"--jobs {jobs}, as given")
    return default_jobs(read_machine(), max(c.world_size for c in rubric.checks), rubric.limits.memory_mb)


def grade_handins(todo: list, out: Path, rubric, jobs: int = kit.JOBS, executor: str = "warm", sandbox: str = "auto",
                  progress: bool = True, first=None) -> tuple:
    """Grade the hand-ins in `todo` on this machine, each one's files written into `out` by the
    pipeline as soon as it is graded (grader.pipeline.record), every world on the data of OUT's data
    key (`data_key`). Returns ({student: status}, worlds run, their seconds): the results themselves
    are read back from `out`. `first`: an executor already started (the batch's probe of the
    sandbox), used and closed here. `jobs`: None, as many as the machine holds (`batch_jobs`)."""
    results, worlds, world_seconds = {}, 0, 0.0
    if not todo:
        if first is not None:
            first.close()
        return results, worlds, world_seconds
    jobs = batch_jobs(jobs, rubric).jobs
    key = data_key(out)
    if first is not None:
        first.key = key   # it has run no world yet
    scratch = Path(scratch_dir("a4-grade-"))
    executors = ([first] if first is not None else []) + [
        make_executor(executor, sandbox, rubric.limits, key, jobs)
        for _ in range(max(1, min(jobs, len(todo))) - (first is not None))]
    bar = Progress(len(todo), progress, len(executors))
    idle = queue.Queue()
    for ex in executors:
        idle.put(ex)
    try:
        executors[0].start()   # SandboxUnavailable before anything runs, where hand-ins cannot be isolated
        tried = canary(executors[0], rubric, scratch, lambda limits: make_executor(executor, sandbox, limits, key, 1))
        write_canary(out, tried)   # what the staff report and `gradebook` read (grader.results.ungradable)
        broken = "" if tried.status != Status.INFRA_ERROR else tried.cause + (
            f"; {tried.fix}" if tried.kind != Cause.MACHINE else "")   # the machine's cause says its fix

        def grade_one(h):
            if broken:
                written = infra_into(h, rubric, out, broken, again=False)   # the canary's cause says when
            else:
                ex = idle.get()
                bar.begin(h.student)
                try:
                    written = grade_into(h, rubric, ex, scratch, out, clocks=tried.clocks)
                finally:
                    idle.put(ex)
            bar.step(h.student, str(written))
            return written

        with ThreadPoolExecutor(max_workers=len(executors)) as pool:
            for future in as_completed([pool.submit(grade_one, h) for h in todo]):
                written = future.result()
                results[written.student] = written.status
    finally:
        bar.close()
        for ex in executors:
            ex.close()
            worlds += ex.worlds
            world_seconds += ex.world_seconds
        shutil.rmtree(scratch, ignore_errors=True)
    return results, worlds, world_seconds
