"""The world's cgroup: the advice given where the grader's cgroup is not its own to divide."""

import os
import shutil
import signal
import subprocess

import pytest

from grader.rerun.sandbox import cgroup


def test_the_scope_advice_offers_systemd_run_only_where_it_reaches_the_users_manager(tmp_path):
    """`systemd-run --user` needs the user's systemd manager, reached over $XDG_RUNTIME_DIR/bus: a
    session without one (su, sudo -u) gets the step that starts one, not a command that fails."""
    without = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}   # as su and sudo -u leave it: no bus
    said = cgroup.scope_hint(without)
    assert "needs your user's systemd manager" in said and "loginctl enable-linger" in said, said
    if shutil.which("systemd-run"):   # the command, run bare there, does fail
        done = subprocess.run(["systemd-run", "--user", "--scope", "true"], env=without, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode != 0 and "bus" in done.stderr.lower(), (done.returncode, done.stderr)
    (tmp_path / "bus").touch()   # a user manager's bus: the command is offered as it is
    assert cgroup.scope_hint({"XDG_RUNTIME_DIR": str(tmp_path)}) == f"start the grader in a scope of its own, {cgroup.SCOPE}"


def test_a_v2_cgroup_given_memory_and_not_pids_is_limited_in_memory_alone(tmp_path):
    """A GPU node's cgroup v2 parent gave its children memory and not pids: a world's folder there
    has memory.max and no pids.max, and writing a file that is not there is refused (EACCES), which
    made every world an infra_error. The limits are written for the controllers the folder has.
    (This machine mounts cgroup v1 only: the folder is a plain one holding the files such a
    cgroup has; the writes are the ones the kernel would take.)"""
    for name in ("memory.max", "memory.swap.max", "cgroup.procs"):
        (tmp_path / name).write_text("max\n")
    world = cgroup.WorldCgroup({"": str(tmp_path)}, 2)
    assert world.controllers == {"memory"}
    world.limit(4096, 132)
    assert (tmp_path / "memory.max").read_text() == str(4096 << 20)
    assert (tmp_path / "memory.swap.max").read_text() == "0"
    assert not (tmp_path / "pids.max").exists()
    (tmp_path / "pids.max").write_text("max\n")   # given pids too: both are limited
    world.limit(2048, 100)
    assert (tmp_path / "pids.max").read_text() == "100"
    assert (tmp_path / "memory.max").read_text() == str(2048 << 20)



def _threads_in(folder: str) -> set:
    """The ids of every thread in a cgroup folder (v1: tasks; v2: cgroup.threads)."""
    name = "tasks" if os.path.exists(os.path.join(folder, "tasks")) else "cgroup.threads"
    with open(os.path.join(folder, name)) as f:
        return set(f.read().split())


def _joined_in_a_child(folders: list, threads: int) -> list:
    """Fork a process that starts `threads - 1` threads, joins `folders` (cgroup.join) and then forks
    a child of its own; return what join said, then, for each folder, whether every thread of both
    processes is in it."""
    import json
    import threading
    import time
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for _ in range(threads - 1):
                threading.Thread(target=threading.Event().wait, daemon=True).start()
            joined = cgroup.join(folders)
            child = os.fork()
            if child == 0:
                time.sleep(60)   # killed once its parent has looked
                os._exit(0)
            ids = set(os.listdir("/proc/self/task")) | {str(child)}
            os.write(write_fd, json.dumps([joined] + [ids <= _threads_in(f) for f in folders]).encode() + b"\n")
            os.kill(child, 9)
            os.waitpid(child, 0)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        said = f.readline()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 and said, said
    return json.loads(said)


def test_a_leader_joins_its_worlds_cgroups_whole_with_one_thread_or_several():
    """A leader of one thread moves through `tasks` (cgroup v1: no wait for the kernel's lock on
    every fork), one of several through cgroup.procs: either way every thread it has, and every
    process it forks after, is in each of the world's folders."""
    world = cgroup.WorldCgroup.make()
    if world is None:
        assert os.geteuid() != 0, f"root is given no cgroup here: {cgroup.WorldCgroup.why}"
        pytest.skip(f"no cgroup of a world's own for this user here ({cgroup.WorldCgroup.why})")
    try:
        for threads in (1, 3):
            assert _joined_in_a_child(world.paths(False), threads) == [True] * (1 + len(world.folders)), threads
    finally:
        world.remove()


def _ended_in(folders: list, allocate_mb: int) -> int:
    """Fork a process that joins `folders` and writes `allocate_mb` of memory, or, with 0, is killed
    (SIGKILL) from outside once it has joined; its exit code."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            cgroup.join(folders)
            os.write(write_fd, b"joined\n")
            if allocate_mb:
                held = [b"x" * (1 << 20) for _ in range(allocate_mb)]   # every page written
                del held
            else:
                signal.pause()   # killed here
        finally:
            os._exit(0)
    os.close(write_fd)
    assert os.read(read_fd, 7) == b"joined\n"
    if not allocate_mb:
        os.kill(pid, 9)
    os.close(read_fd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_leader_the_kernel_killed_for_its_worlds_memory_reads_out_of_memory_not_lost():
    """A world's leader, outside its PID namespace, killed by the kernel for the world's memory (a
    hand-in's memory no rank shows, such as files in the world's /dev/shm, outlives the ranks the
    kernel killed first): the zygote, which never reads the job, reports the world out of memory,
    and the grader gives the parts the world's memory verdict. Killed by anything else, it is lost."""
    from grader.rerun import check, world
    from grader.rerun.sandbox import memory, sweep
    from grader.rerun.wire import protocol
    made = cgroup.WorldCgroup.make()
    if made is None:
        assert os.geteuid() != 0, f"root is given no cgroup here: {cgroup.WorldCgroup.why}"
        pytest.skip(f"no cgroup of a world's own for this user here ({cgroup.WorldCgroup.why})")
    try:
        made.limit(64, 64)
        folders = sweep.open_world(made.paths(False))   # the world's own, below the executor's: the zygote's
        kills = cgroup.oom_kills(folders)
        code = _ended_in(folders, allocate_mb=256)
        assert code == -9 and cgroup.oom_kills(folders) > kills, code
        report = world.leader_ended(code, folders, kills)
        assert report.abort.reason == protocol.StopReason.OUT_OF_MEMORY and report.abort.part is None
        runs = check._unstarted_parts(["baseline"], report, check.Words({}, False), 64)
        assert runs["baseline"].status.value == "oom" and memory.verdict(64) in runs["baseline"].detail
        kills = cgroup.oom_kills(folders)
        code = _ended_in(folders, allocate_mb=0)
        lost = world.leader_ended(code, folders, kills)
        assert code == -9 and lost.abort.reason == protocol.StopReason.RANK_DIED, code
        assert lost.abort.detail == "the world's leader ended with -9"
        sweep.end_world(folders)
    finally:
        made.remove()
