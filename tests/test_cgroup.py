"""The world's cgroup: the advice given where the grader's cgroup is not its own to divide."""

import os
import shutil
import subprocess

from grader.rerun import cgroup


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
