"""The processes the executors start: `python -m grader.rerun.zygote --zygote MODE` (the warm
executor's helper; the kit's folder comes as its first message, Setup, never on its command line)
or `--torchrun-rank JOB_FILE` (one rank under torchrun).

The zygote imports torch once, takes one tiny step so the lazy imports are paid, freezes its heap,
and then, for each world asked of it, forks a leader that alone reads the job (grader.rerun.world)
and, once it has forked the world's ranks, the data key sent after it (grader.rerun.wire.secret).

Everything it and the leaders send the executor is a frame marked with the world it belongs to
(grader.rerun.wire.channel): the world's report, from its leader (or from the zygote when the leader was
killed), then a Hello marked with the same world once the zygote has cleaned up after it and is
ready for the next. Where a world's /tmp could not be emptied the zygote exits instead, and the
executor starts a new sandbox.

What a hand-in's ranks do to the processes above them is the hand-in's failure, never the
machine's: the zygote and every leader ignore the signals a rank of the same user could send them
(grader.rerun.world.SHIELDED; ranks get them back), a leader that is stopped anyway (SIGSTOP,
where a world has no PID namespace of its own) is killed and its world reported lost, and a world's
report always fits its frame (grader.rerun.wire.bounds.fit).
"""

import json
import os
import signal
import sys

from grader import typed
from grader.rerun.wire import bounds, channel, protocol
from grader.limits import Limits


def _reply(fd: int, world: int):
    """A function that sends a message to the executor as world `world`'s."""
    return lambda message: channel.send_framed(fd, world, body=bounds.fitted_body(message))


def receive_framed(allowed, skip_world: int = None):
    """The next frame on stdin, decoded: (world, message), or (0, None) at end of file. Frames of
    world `skip_world` are stepped over unread (channel.read_framed)."""
    frame = channel.read_framed(0, skip_world)
    return (0, None) if frame is None else (frame[0], protocol.decode(frame[1], allowed))


KEY_WAIT = 10.0


def read_key():
    """In a world's leader, once its ranks are forked: the data key the executor sent after the job
    (grader.rerun.wire.secret), or None if none came (the leader then draws fresh seeds)."""
    import select
    try:
        if not select.select([0], [], [], KEY_WAIT)[0]:
            return None
        frame = channel.read_framed(0)
        message = None if frame is None else protocol.decode(frame[1], (protocol.DataKey,))
        return bytes.fromhex(message.key) if message is not None and len(message.key) == 64 else None
    except (OSError, ValueError):   # ChannelError is a ValueError
        return None


def _reap(pid: int) -> int:
    """The exit code of the world's leader `pid`; one that is stopped (a rank of the same user sent
    it SIGSTOP) is killed: its world is lost, never hung."""
    while True:
        status = os.waitpid(pid, os.WUNTRACED)[1]
        if not os.WIFSTOPPED(status):
            return os.waitstatus_to_exitcode(status)
        os.kill(pid, signal.SIGKILL)


def _hide_command_line() -> None:
    """Write over this process's command line where /proc/PID/cmdline reads it, in its own memory
    (Python keeps a copy of argv): the Python's path, in a kit's own .venv the kit's folder, is then
    not there for any process that sees this one (or a world forked from it) to read."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])   # arg_start and arg_end, fields 48 and 49 of proc(5)
    except (OSError, IndexError, ValueError):
        return   # no /proc: nothing shows it either
    import ctypes
    ctypes.memmove(start, b"python3\0-m\0grader.rerun.zygote\0"[:end - start].ljust(end - start, b"\0"), end - start)


def _boot() -> int:
    """Make this process the zygote: its signals, its path, torch and the engine imported once (and
    so inherited by every rank), its heap frozen. Returns the control pipe's file descriptor."""
    import gc
    _hide_command_line()
    from grader.rerun.world import SHIELDED
    for sig in SHIELDED:   # inherited by every leader; a rank's fork sets them back
        signal.signal(sig, signal.SIG_IGN)
    # Sources only: the interpreter writes no bytecode, and only the engine's folder and the Python
    # installation are on the path (not the working folder, /tmp, which ranks write to).
    sys.dont_write_bytecode = True
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
    # torch is imported once here, inherited by every rank
    from grader.rerun import world  # noqa: F401 - every fork's modules, imported once here
    from grader.rerun.rank import worker
    from grader.rerun.sandbox import environment, namespaces, scratch, sweep  # noqa: F401 - likewise
    environment.bound_zygote()   # before the first fork: every pool of every rank has one thread
    worker.warm_up()
    for message in protocol.TYPES.values():   # what every leader and rank decodes: its types resolved once, here
        typed.resolve(message)
    # Everything alive now is shared with every fork; frozen, no child's garbage collector walks
    # (and so copies) it.
    gc.collect()
    gc.freeze()
    environment.fold_into_huge_pages()   # what every fork after copies: 512 times fewer page-table entries
    control_out = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray prints must not reach the control pipe
    namespaces.prctl(namespaces.PR_SET_PDEATHSIG, signal.SIGKILL)
    namespaces.prctl(namespaces.PR_SET_DUMPABLE, 0)
    if not os.environ.get("A4_IN_SANDBOX"):   # a world's orphans come back here, never to init (grader.rerun.sandbox.sweep)
        namespaces.prctl(namespaces.PR_SET_CHILD_SUBREAPER, 1)
    import encodings.idna  # noqa: F401 - a hand-in's socket to "127.0.0.1" needs it; load it once here
    return control_out


def _zygote(mode: str, sandbox_name: str) -> None:
    """The warm helper: for each world, fork a leader that reads the job, runs it and reports.

    The zygote itself never reads a job: no check's values are ever in its memory, and so none in
    the memory of the ranks forked after it.
    """
    control_out = _boot()
    from grader.rerun.sandbox import cgroup, namespaces, scratch, sweep
    from grader.rerun import world
    from grader.rerun.rank import syscalls
    cgroups = [c for c in os.environ.get("A4_CGROUPS", "").split(os.pathsep) if c]
    _, start = receive_framed((protocol.Setup,))
    isolation = namespaces.probe(mode, start.kit if start else "", sandbox_name, cgroups)
    syscalls.note(isolation)
    hello = protocol.Hello(isolation=isolation.summary())
    _reply(control_out, 0)(hello)
    last = None
    while True:
        # What the last world's leader left unread (its job or data key, if it died first) is
        # stepped over unread: no world's key is ever in the zygote's memory, nor in what it forks.
        number, request = receive_framed((protocol.WorldRequest, protocol.Exit), skip_world=last)
        if not isinstance(request, protocol.WorldRequest):
            return
        last = number
        reply = _reply(control_out, number)
        uid = namespaces.world_uid(isolation)
        ending = None if os.environ.get("A4_IN_SANDBOX") else sweep.World(isolation.cgroups, uid)
        cgroups = ending.cgroups if ending else isolation.cgroups   # the folders its leader joins
        kills = cgroup.oom_kills(cgroups)
        pid = os.fork()
        if pid == 0:
            _, job = receive_framed((protocol.WorldJob,))
            world.lead_world(job, isolation, reply, read_key, uid, cgroups)
        code = _reap(pid)
        if code != 0:
            # The leader was killed, perhaps before it could report: say so, so the grader need not
            # wait (a report it did send first wins; this one is then stepped over).
            reply(world.leader_ended(code, cgroups, kills))
        # Nothing of this world may outlive it: no process, no file in /tmp or /dev/shm.
        left = ending.end() if ending else []
        if left or not scratch.clean_between_worlds():
            print("; ".join(left), file=sys.stderr)
            return   # the executor sees the end of the pipe, and starts a new sandbox (or helper)
        reply(hello)


def _torchrun_rank(job_file: str) -> None:
    from grader.rerun.sandbox import environment, namespaces, tasks
    from grader.rerun.rank import worker
    with open(job_file) as f:
        job = protocol.decode(json.load(f), (protocol.WorldJob,))
    rank = int(os.environ["RANK"])
    fd = os.open(os.path.join(job.work_dir, f"rank{rank}.fifo"), os.O_WRONLY)
    data_fd = os.open(os.path.join(job.work_dir, f"rank{rank}.data"), os.O_RDONLY)
    worker.warm_up()  # on the start-up clock, as the zygote does, not on the first part's
    os.chdir(job.work_dir)
    limits = Limits(**job.limits)
    namespaces.limit_rank(limits, os.getuid(), tasks.rank_nproc(tasks.Hold.WATCHDOG, False, limits.processes))
    environment.hold_rank()
    worker.rank_main(job, rank, fd, data_fd=data_fd)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--zygote"] and len(sys.argv) >= 3:
        _zygote(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
    elif sys.argv[1:2] == ["--torchrun-rank"]:
        _torchrun_rank(sys.argv[2])
    else:
        sys.exit("usage: python -m grader.rerun.zygote --zygote MODE [SANDBOX] | --torchrun-rank JOB_FILE (the grader runs it)")
