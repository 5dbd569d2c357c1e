"""The world's cgroup: the advice given where the grader's cgroup is not its own to divide."""

import os
import shutil
import subprocess

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
