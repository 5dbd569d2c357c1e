"""One re-run world: sandbox it, fork its ranks, watch their result pipes and clocks, end it, report.

`lead_world(job, ...)` runs in a process forked for this world alone (from a parent that has
imported torch and nothing of any hand-in): it enters the world's namespaces (grader.sandbox),
forks `world_size` ranks, each with its limits, stdout and stderr going to a file of its own, and
supervises them. `supervise` reads every rank's messages and decides when the world ends:

- all ranks reported every part: the world is complete;
- a part's results disagree across ranks (ok on some, an error on others) or a collective failed:
  the ranks may be out of step, so the world is ended and the report says at which part;
- a part runs past its wall clock, or a rank dies: likewise, naming the part;
- the code does not load, or gloo does not start: the world ends before any part.

The caller (grader.rerun) starts a new world for the parts after the one that ended a world, so a
part that crashes or hangs costs only that part.
"""

import os
import selectors
import signal
import time

from grader import channel, sandbox

OUTPUT_HEAD = 4096
OUTPUT_TAIL = 8192


def _close_inherited(keep: int) -> None:
    """Close every descriptor above `keep` (listing them is far quicker than closing all possible)."""
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        if int(name) > keep:
            try:
                os.close(int(name))
            except OSError:
                pass


def fork_rank(job: dict, rank: int, pgid: int, uid: int, limits, prepared: dict) -> tuple:
    """Fork rank `rank` into process group `pgid` (0: a new group); return (pid, read end of its pipe)."""
    from grader import worker
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the rank
        try:
            os.setpgid(0, pgid)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            out = os.open(os.path.join(job["work_dir"], f"rank{rank}.out"),
                          os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            if uid != os.getuid():
                os.fchown(out, uid, uid)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.dup2(write_fd, 3)  # the result pipe is fd 3; every other descriptor is closed
            _close_inherited(3)
            os.chdir(job.get("cwd", job["work_dir"]))
            sandbox.limit_rank(limits, uid)
            worker.rank_main(job, rank, 3, prepared)
        finally:
            os._exit(4)
    os.close(write_fd)
    try:
        os.setpgid(pid, pgid or pid)
    except OSError:
        pass  # the child has already done it (or exited)
    return pid, read_fd


def run_world(job: dict, uid: int, limits) -> dict:
    """Fork the world's ranks, supervise them to the end, and return the world's report."""
    from grader import worker
    prepared = worker.prepare(job)
    pids, fds = [], {}
    pgid = 0
    for rank in range(job["world_size"]):
        pid, fd = fork_rank(job, rank, pgid, uid, limits, prepared)
        pgid = pgid or pid
        pids.append(pid)
        fds[rank] = fd
    return supervise(job, fds, pids, pgid)


def _readable(path: str) -> None:
    """Let the world's user read the hand-in's code (and nothing else of ours)."""
    for folder, dirs, files in os.walk(path):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)


def lead_world(job: dict, isolation, control_out: int) -> None:
    """The life of a world's leader: sandbox, ranks, supervision, report. Never returns."""
    report = None
    try:
        sandbox.prctl(sandbox.PR_SET_PDEATHSIG, signal.SIGKILL)
        limits = sandbox.Limits(**job["limits"])
        uid = sandbox.world_uid(isolation)
        _readable(job["code_dir"])
        if uid != os.getuid():
            os.chown(job["work_dir"], uid, uid)
        sandbox.unshare_world(isolation)
        if isolation.pid:
            # The first child of a new PID namespace is its init: when it ends, all of the world ends.
            pid = os.fork()
            if pid:
                status = os.waitpid(pid, 0)[1]
                if os.waitstatus_to_exitcode(status) != 0:
                    report = lost_report(job, f"the world's supervisor ended with {os.waitstatus_to_exitcode(status)}")
                else:
                    os._exit(0)
                raise SystemExit
            sandbox.prctl(sandbox.PR_SET_PDEATHSIG, signal.SIGKILL)
        paths = sandbox.private_root(isolation, limits, job["code_dir"], job["work_dir"])
        job = {**job, **paths, "cwd": "/tmp" if isolation.mount else paths["work_dir"]}
        sandbox.prctl(sandbox.PR_SET_DUMPABLE, 0)  # no same-user process may read this one's memory
        report = run_world(job, uid, limits)
    except SystemExit:
        pass
    except sandbox.SandboxError as e:
        report = infra_report(job, f"the sandbox could not be set up: {e}")
    except BaseException as e:  # noqa: BLE001 - the grader must always get a report
        report = infra_report(job, f"the world's leader failed: {type(e).__name__}: {e}")
    finally:
        try:
            if report is not None:
                report["isolation"] = isolation.summary()
                channel.send(control_out, report)
        finally:
            os._exit(0)


def lost_report(job, detail: str) -> dict:
    """The report of a world whose supervisor was killed (a hand-in that signals its parent, or the
    kernel's out-of-memory killer): the parts not yet reported crashed."""
    return {"type": "world_report", "completed": [], "results": {p: {} for p in job["parts"]} if job else {},
            "abort": {"reason": "rank_died", "part": None, "detail": detail},
            "exit_codes": {}, "output": {}, "skipped_lines": [], "seconds": 0.0}


def infra_report(job: dict, detail: str) -> dict:
    """The report of a world the machinery could not run: no part of the hand-in is to blame."""
    return {"type": "world_report", "completed": [], "results": {p: {} for p in job["parts"]},
            "abort": {"reason": "infra_error", "part": None, "detail": detail},
            "exit_codes": {}, "output": {}, "skipped_lines": [], "seconds": 0.0}


def _output(work_dir: str, world_size: int) -> dict:
    """Head and tail of what each rank wrote to stdout/stderr."""
    out = {}
    for rank in range(world_size):
        path = os.path.join(work_dir, f"rank{rank}.out")
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(OUTPUT_HEAD)
                if size > OUTPUT_HEAD + OUTPUT_TAIL:
                    f.seek(size - OUTPUT_TAIL)
                    head += b"\n[... %d bytes left out ...]\n" % (size - OUTPUT_HEAD - OUTPUT_TAIL)
                head += f.read()
            out[rank] = head.decode("utf-8", "replace")
        except OSError:
            out[rank] = ""
    return out


def _end(pgid: int, pids: list, grace: float = 0.0) -> dict:
    """Kill the world's process group and reap its ranks; return each rank's exit code (-signal)."""
    deadline = time.monotonic() + grace
    codes = {}
    while grace and time.monotonic() < deadline and len(codes) < len(pids):
        for rank, pid in enumerate(pids):
            if rank not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[rank] = os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for rank, pid in enumerate(pids):
        if rank not in codes:
            try:
                codes[rank] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            except ChildProcessError:
                codes[rank] = None
    return codes


def _in_order(expecting: dict, rank: int, message: dict, parts: list) -> bool:
    """Whether `message` is the one rank `rank` may send now: ready, then start/result for each part
    in the job's order, then done. Advances the rank's expectation."""
    kind, part = message["type"], message.get("part")
    want = expecting[rank]
    if want == "ready":
        ok = kind == "ready"
        nxt = ("start", parts[0]) if parts else "done"
    elif isinstance(want, tuple) and want[0] == "start":
        ok = kind == "start" and part == want[1]
        nxt = ("result", want[1])
    elif isinstance(want, tuple) and want[0] == "result":
        ok = kind == "result" and part == want[1]
        i = parts.index(want[1]) + 1
        nxt = ("start", parts[i]) if i < len(parts) else "done"
    else:
        ok, nxt = kind == "done", "nothing"
    if ok:
        expecting[rank] = nxt
    return ok


def supervise(job: dict, fds: dict, pids: list, pgid: int, collect_output=None,
              launcher_exited=None) -> dict:
    """Watch the ranks of one world until it is complete or must end; see the module docstring.

    `launcher_exited`, when given, says whether the process that started the ranks has ended
    (torchrun); the world cannot finish after that.
    """
    parts, world_size = job["parts"], job["world_size"]
    timeouts = job["timeouts"]
    started = time.monotonic()
    timeline = {}     # when (s after the ranks were forked) every rank was ready, was done, ...
    start_deadline = started + timeouts["world_start"]
    readers = {rank: channel.Reader() for rank in fds}
    selector = selectors.DefaultSelector()
    for rank, fd in fds.items():
        selector.register(fd, selectors.EVENT_READ, rank)
    ready, done, closed = set(), set(), set()
    gave_up = set()   # ranks that reported a failed collective and then ended on purpose
    expecting = {rank: "ready" for rank in fds}   # the only message each rank may send next
    in_part = {}      # rank -> the part it last started
    results = {p: {} for p in parts}
    part_started = {}
    skipped = []
    judged = 0        # parts[:judged] have a consistent result from every rank
    abort = None      # {"reason", "part", "detail"}

    def stop(reason, part=None, detail=""):
        nonlocal abort
        if abort is None:
            abort = {"reason": reason, "part": part, "detail": detail}

    while abort is None:
        while judged < len(parts) and len(results[parts[judged]]) == world_size:
            statuses = sorted({m.get("status") for m in results[parts[judged]].values()})
            if "dist_error" in statuses:
                stop("dist_error", parts[judged])
                break
            if len(statuses) > 1:
                stop("ranks_disagree", parts[judged], " / ".join(statuses))
                break
            judged += 1
        if abort is not None or (judged == len(parts) and len(done) == world_size):
            break
        now = time.monotonic()
        current = parts[judged] if judged < len(parts) else None
        deadlines = []
        if len(ready) < world_size:
            deadlines.append(start_deadline)
            if now >= start_deadline:
                stop("start_timeout", None, f"ranks {sorted(set(fds) - ready)} did not load the code "
                                            f"within {timeouts['world_start']:g} s")
                break
        if current in part_started:
            deadline = part_started[current] + timeouts["part"]
            deadlines.append(deadline)
            if now >= deadline:
                late = sorted(set(fds) - set(results[current]))
                stop("timeout", current, f"ranks {late} still running after {timeouts['part']:g} s")
                break
        if len(closed) == world_size or (launcher_exited and launcher_exited() and len(done) < world_size
                                         and not any(selector.select(timeout=0))):
            stop("rank_died", current, "the ranks exited before the world was complete")
            break
        wait = max(0.0, min(deadlines) - now) if deadlines else 1.0
        for key, _ in selector.select(timeout=min(wait, 1.0)):
            rank = key.data
            data = os.read(key.fd, 1 << 16)
            if not data:
                selector.unregister(key.fd)
                closed.add(rank)
                if rank not in done and rank not in gave_up and abort is None:
                    stop("rank_died", current, f"rank {rank} exited before it finished")
                continue
            try:
                messages = readers[rank].feed(data)
            except channel.ChannelError as e:
                stop("protocol", current, f"rank {rank} sent a malformed message: {e}")
                break
            for message in messages:
                kind = message["type"]
                message["rank"] = rank  # the pipe, not the message, says which rank it is
                if kind not in ("load_failed", "infra_error") and not _in_order(expecting, rank, message, parts):
                    # Blame the earliest part not yet settled: the rank's own, even if a forged result
                    # had completed it, or an earlier one that processes of this rank ran ahead of.
                    blamed = in_part.get(rank, current)
                    if blamed in parts:
                        judged = min(judged, parts.index(blamed))
                    stop("protocol", parts[judged] if judged < len(parts) else None,
                         f"rank {rank} sent {kind!r} out of order (a second result, or a message "
                         f"written by the hand-in itself)")
                    break
                if kind == "ready":
                    ready.add(rank)
                    if len(ready) == world_size:
                        timeline["ready"] = round(time.monotonic() - started, 4)
                    skipped = message.get("skipped_lines", skipped)
                elif kind == "start" and message.get("part") in results:
                    part_started.setdefault(message["part"], time.monotonic())
                    in_part[rank] = message["part"]
                elif kind == "result" and message.get("part") in results:
                    results[message["part"]].setdefault(rank, message)
                    if message.get("status") == "dist_error":
                        gave_up.add(rank)
                elif kind == "done":
                    done.add(rank)
                    if len(done) == world_size:
                        timeline["done"] = round(time.monotonic() - started, 4)
                elif kind == "load_failed":
                    stop("load_failed", None, message.get("error", {}).get("exception", ""))
                    abort["error"] = message.get("error")
                elif kind == "infra_error":
                    stop("infra_error", None, message.get("error", {}).get("exception", ""))
                else:
                    stop("protocol", current, f"rank {rank} sent an unexpected message {kind!r}")
    exit_codes = _end(pgid, pids, grace=0.5 if abort is None else 0.0)
    for fd in fds.values():
        os.close(fd)
    selector.close()
    timeline["ended"] = round(time.monotonic() - started, 4)
    output = collect_output() if collect_output else _output(job["work_dir"], world_size)
    return {"type": "world_report", "completed": parts[:judged], "results": results, "abort": abort,
            "exit_codes": exit_codes, "output": output, "skipped_lines": skipped,
            "seconds": round(time.monotonic() - started, 3), "timeline": timeline}
