"""One re-run world: sandbox it, fork its ranks, supervise them, report.

`lead_world(job, ...)` runs in a process forked for this world alone (from a parent that has
imported torch and nothing of any hand-in): it enters the world's namespaces (grader.rerun.sandbox.namespaces),
writes the hand-in's code into the world's folder, forks `world_size` ranks, each with its limits, stdout and stderr going to a file of its own, and
hands them to grader.rerun.supervise, which decides when the world ends and at which part.

Only then, with every rank forked, does the leader read the data key the grader sent after the job
and derive the parts' data from it (grader.rerun.wire.secret): no rank holds it but the view the
supervisor sends it, and the leader cannot be read by the ranks (it is not dumpable). The data's
seeds go back to the grader in the world's report.

The caller (grader.rerun.check) starts a new world for the parts after the one that ended a world,
so a part that crashes or hangs costs only that part.
"""

import dataclasses
import fcntl
import os
import signal
import time

from grader.rerun.sandbox import cgroup, memory, namespaces, scratch, tasks
from grader.rerun.wire import protocol
from grader.rerun.wire.protocol import Abort, StopReason, WorldJob, WorldReport
from grader.rerun import starved
from grader.rerun.supervise import draw_secrets, supervise
from grader.rerun.rank import store as rendezvous
from grader.rerun.rank import syscalls
from grader.rerun.rank.source import compiled_blob
from grader.limits import Limits

# Signals a process of the same user may send that would end or stop a leader: the zygote ignores
# them, and so every leader (the init of a world's PID namespace gets, from inside, only those it
# has a handler for, as Python's SIGINT); each rank gets them back.
SHIELDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
            signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def _close_inherited(keep: int) -> None:
    """Close every descriptor above `keep` (listing them is far quicker than closing all possible)."""
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        if int(name) > keep:
            try:
                os.close(int(name))
            except OSError:
                pass


def fork_rank(job: WorldJob, rank: int, pgid: int, uid: int, limits: Limits, prepared: dict, nproc: int = 0,
              isolation=None, listener=None) -> tuple:
    """Fork rank `rank` into process group `pgid` (0: a new group); return (pid, read end of its
    result pipe, write end of its data pipe). `nproc`: its RLIMIT_NPROC (grader.rerun.sandbox.tasks); where
    the world has namespaces of its own (`isolation.per_rank`), the rank gets a view of its own
    (grader.rerun.sandbox.scratch.rank_view). `listener`: the world's store's socket
    (grader.rerun.rank.store), which rank 0 serves as its fd store.FD and the others connect to."""
    from grader.rerun.sandbox import environment
    from grader.rerun.rank import worker
    read_fd, write_fd = os.pipe()
    data_read, data_write = os.pipe()
    port = listener.getsockname()[1] if listener else 0
    pid = os.fork()
    if pid == 0:  # the rank
        try:
            os.setpgid(0, pgid)
            cgroup.first_to_die()   # before its own view's user namespace: as root, a floor it cannot lower
            for sig in SHIELDED + (signal.SIGPIPE, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            out = os.open(os.path.join(job.work_dir, f"rank{rank}.out"),
                          os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            if uid != os.getuid():
                os.fchown(out, uid, uid)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            # the result pipe is fd 3, the data pipe fd 4, rank 0's store socket fd 5; every other descriptor is closed
            serves = fcntl.fcntl(listener.fileno(), fcntl.F_DUPFD, 16) if rank == 0 and listener else None
            if data_read == 3:
                data_read = os.dup(data_read)
            os.dup2(write_fd, 3)
            os.dup2(data_read, 4)
            if serves is not None:
                os.dup2(serves, rendezvous.FD)
            _close_inherited(4 if serves is None else rendezvous.FD)
            private = isolation is not None and isolation.per_rank
            if private:
                own = ([] if listener else [job.store]) + [os.path.join(job.work_dir, f"rank{rank}.calls")]
                scratch.rank_view(job.work_dir, job.code_dir, own, limits.tmp_mb, isolation.id_range <= 1, nproc)
            else:   # the machine's /tmp is shared: what tempfile makes goes into the world's folder, removed with it
                os.environ["TMPDIR"] = job.work_dir
            os.chdir(job.work_dir)
            # Not dumpable where its leader is privileged over its user id: no other rank reads it through /proc.
            namespaces.limit_rank(limits, uid, nproc, dumpable=not (private and isolation.id_range > 1))
            if isolation is not None and isolation.refused:
                syscalls.refuse()
            environment.hold_rank()
            worker.rank_main(job, rank, 3, prepared, 4, port)
        finally:
            os._exit(4)
    os.close(write_fd)
    os.close(data_read)
    os.set_blocking(data_write, False)   # a rank that stops reading its orders must never hold up the leader
    try:
        os.setpgid(pid, pgid or pid)
    except OSError:
        pass  # the child has already done it (or exited)
    return pid, read_fd, data_write


def run_world(job: WorldJob, uid: int, limits: Limits, read_key=None, isolation=None, began=None,
              cgroups=None) -> WorldReport:
    """Fork the world's ranks, supervise them to the end, and return the world's report.
    `read_key` reads the data key (grader.rerun.wire.secret) once the ranks are forked (None: fresh data).
    The world as a whole is held to limits.memory_mb and limits.processes (grader.rerun.sandbox.memory);
    `cgroups`: the folders this process joined for the world (the isolation's by default), whose
    out-of-memory kills are the world's.
    The report's timeline gets "forked": seconds from `began` (the leader's start) to every rank forked."""
    began = time.monotonic() if began is None else began
    from grader.rerun.rank import worker
    prepared = worker.prepare(job)
    namespaces.prctl(namespaces.PR_SET_CHILD_SUBREAPER, 1)   # what the ranks start stays below us, for the watchdog
    held = tasks.Hold[isolation.tasks] if isolation is not None and isolation.tasks else tasks.Hold.WATCHDOG
    nproc = tasks.rank_nproc(held, uid != os.getuid(), limits.processes,
                             machine_visible=isolation is None or not isolation.processes)
    pids, fds, orders = [], {}, {}
    pgid = 0
    for path in [os.path.join(job.work_dir, f"rank{rank}.calls") for rank in range(job.world_size)]:
        _own_file(path, uid)   # the files a rank writes beside its code: made here, each bound into its rank's view
    with rendezvous.listen(job.world_size) as listener:   # in the world's network namespace; rank 0 keeps it
        for rank in range(job.world_size):
            pid, fds[rank], orders[rank] = fork_rank(job, rank, pgid, uid, limits, prepared, nproc, isolation, listener)
            pgid = pgid or pid
            pids.append(pid)
    outputs = [os.path.join(job.work_dir, f"rank{rank}.out") for rank in range(job.world_size)]
    forked = round(time.monotonic() - began, 4)
    key = read_key() if read_key else None   # only now: no rank holds it
    if cgroups is None:
        cgroups = isolation.cgroups if isolation is not None else []
    own = isolation is not None and isolation.per_world
    with memory.Watchdog(limits.memory_mb, outputs, limits.processes, cgroups, pids, own) as watchdog:
        report = supervise(job, fds, orders, pids, pgid, draw_secrets(job, key),
                           cpu_time=lambda: starved.cpu_time(watchdog.rank_pids(), cgroups))
        report.timeline["forked"] = forked
        if not job.compiled and prepared["code"] is not None:   # for the next world of this code
            report.compiled = compiled_blob(prepared["code"], prepared["skipped"], prepared["utils"])
        return out_of_memory(report, watchdog, job)


def out_of_memory(report: WorldReport, watchdog, job: WorldJob) -> WorldReport:
    """A world that ran out of memory (its watchdog's count, or its cgroup's kill) ended out of
    memory, at the part its `culprit` (the rank that held most) was running, or the first part not
    settled: however its ranks then died (a SIGKILL, a collective whose peer vanished), one cause
    gets one verdict, whichever layer caught it."""
    if report.abort is None or not watchdog.ran_out():
        return report
    unsettled = [p for p in job.parts if p not in report.completed]
    part = next((p for p in unsettled if watchdog.culprit not in report.results.get(p, {})), None) \
        if watchdog.culprit is not None else None
    part = part or (unsettled[0] if unsettled else None)
    report.abort = Abort(reason=StopReason.OUT_OF_MEMORY, part=part, detail=watchdog.verdict)
    return report


def _own_file(path: str, uid: int) -> None:
    """An empty file at `path` that the ranks' user `uid` may write."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        if uid != os.getuid():
            os.fchown(fd, uid, uid)
    finally:
        os.close(fd)


def write_code(job: WorldJob, code_dir: str) -> str:
    """Write the job's code into `code_dir`, readable to any user (a rank may run under its own)."""
    os.makedirs(code_dir, exist_ok=True)
    os.chmod(code_dir, 0o755)
    for name, text in job.code.items():
        assert "/" not in name and not name.startswith("."), name
        path = os.path.join(code_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(path, 0o644)
    return code_dir


def _as_init(job: WorldJob, cgroups: list):
    """Fork the first process of the world's new PID namespace (its init: when it ends, all of the
    world ends). In the parent, wait for it: return the report if it failed, else exit."""
    kills = cgroup.oom_kills(cgroups) if cgroups else 0
    pid = os.fork()
    if pid == 0:
        namespaces.prctl(namespaces.PR_SET_PDEATHSIG, signal.SIGKILL)
        return None
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code == 0:
        os._exit(0)
    return killed_report(job, "the world's supervisor", code, bool(cgroups) and cgroup.oom_kills(cgroups) > kills)


def killed_report(job, who: str, code: int, out_of_memory: bool) -> WorldReport:
    """The report of a world whose supervisor (`who`) ended with `code` before it reported: out of
    memory where the kernel killed it for the world's cgroup (`out_of_memory`: an out-of-memory kill
    counted there; its ranks' memory, mid-teardown, was not yet given back), else lost. Which part
    was running is not known: every part not reported is charged, as the cause says."""
    if code == -signal.SIGKILL and out_of_memory:   # without the job (the zygote's), the grader says the limit
        return protocol.stopped(job, StopReason.OUT_OF_MEMORY, memory.verdict(Limits(**job.limits).memory_mb) if job else "")
    return lost_report(job, f"{who} ended with {code}")


def leader_ended(code: int, cgroups: list, kills: int) -> WorldReport:
    """In the zygote, which never reads a job: the report of a world whose leader ended with `code`
    before it reported. Out of memory where the kernel killed it for the world's `cgroups` (their
    out-of-memory kills past `kills`, counted before it was forked: a hand-in's memory the kernel
    shows in no rank, such as files in the world's /dev/shm, outlives the ranks it killed first);
    the machinery's failure where it exited with a status of its own (a leader reports whatever
    happens, then exits 0: only the grader's own Python, reading its job, exits otherwise); else lost."""
    if code > 0:
        return infra_report(None, f"the world's leader exited with status {code} before its world began")
    return killed_report(None, "the world's leader", code, bool(cgroups) and cgroup.oom_kills(cgroups) > kills)


def lead_world(job: WorldJob, isolation, reply, read_key=None, uid=None, cgroups=None) -> None:
    """The life of a world's leader: namespaces, code, ranks, the data key (`read_key`, once the
    ranks are forked), supervision, report (`reply` sends it to the grader, marked as this world's).
    `uid`: the ranks' user id (namespaces.world_uid by default); `cgroups`: the folders the world runs
    in (the executor's by default; without the sandbox, one of the world's own below each).
    Never returns."""
    report, began = None, time.monotonic()
    try:
        namespaces.prctl(namespaces.PR_SET_PDEATHSIG, signal.SIGKILL)
        # A session of the world's own: where the kernel shares the CPU by session (autogroup), what
        # a rank does to its session's share (/proc/self/autogroup's nice) ends with its world, not
        # with the executor's every later world
        os.setsid()
        limits = Limits(**job.limits)
        uid = namespaces.world_uid(isolation) if uid is None else uid
        cgroups = cgroups or isolation.cgroups
        if cgroups:   # before anything of the world is forked: all of it is counted
            cgroup.join(cgroups)
        if isolation.passable:   # outside the sandbox, as root: ranks reach the Python below /root
            scratch.own_mounts(isolation.passable, [job.work_dir])
        if isolation.per_world:   # first: the code goes into the world's own new /tmp
            namespaces.unshare_world(isolation, limits.tmp_mb)
            report = _as_init(job, cgroups)
        if report is None:
            os.makedirs(job.work_dir, exist_ok=True)
            job = dataclasses.replace(job, code_dir=write_code(job, os.path.join(job.work_dir, "code")))
            if isolation.per_world:
                scratch.read_only(job.code_dir)
            if uid != os.getuid():
                os.chown(job.work_dir, uid, uid)
            namespaces.prctl(namespaces.PR_SET_DUMPABLE, 0)  # no same-user process may read this one's memory
            report = run_world(job, uid, limits, read_key, isolation, began, cgroups)
    except namespaces.SandboxError as e:
        report = infra_report(job, f"the sandbox could not be set up: {e}")
    except BaseException as e:  # noqa: BLE001 - the grader must always get a report
        report = infra_report(job, f"the world's leader failed: {type(e).__name__}: {e}")
    finally:
        try:
            if report is not None:
                report.isolation = isolation.summary()
                reply(report)
        finally:
            os._exit(0)


def lost_report(job, detail: str) -> WorldReport:
    """The report of a world whose supervisor was killed (a hand-in that signals its parent, or the
    kernel's out-of-memory killer): the parts not yet reported crashed."""
    return protocol.stopped(job, StopReason.RANK_DIED, detail)


def infra_report(job: WorldJob, detail: str) -> WorldReport:
    """The report of a world the machinery could not run: no part of the hand-in is to blame."""
    return protocol.stopped(job, StopReason.INFRA_ERROR, detail)
