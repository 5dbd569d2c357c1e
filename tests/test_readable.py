"""What a rank under a user id of its own cannot read of the Python (grader.rerun.sandbox.readable), tried
as that id on a tree made for it: an unreadable module is named, a distribution's link to a target
that is not installed is not (it dangles for every user alike: no chmod helps, no rank loads it),
and a link into a folder the id cannot pass is named.

Found on a GPU node whose Python's library folder (/usr/lib/x86_64-linux-gnu) holds Debian's
alternatives links (libblas.so -> /etc/alternatives/...): inside the sandbox, before it bound
/etc/alternatives, they dangled and grading refused the whole machine."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from grader.rerun import bwrap
from grader.rerun.sandbox import readable
from tests.conftest import skip_unless_required

NOBODY = 65534


@pytest.fixture
def as_root():
    """A folder every user may pass, under /tmp (pytest's own is its owner's only); root only."""
    if os.geteuid() != 0:
        skip_unless_required("A4_REQUIRE_TA_CONFIGS", "trying another user id needs root")
    folder = Path(tempfile.mkdtemp(prefix="a4-readable-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def tree(folder: Path) -> Path:
    root = folder / "lib"
    (root / "private").mkdir(parents=True)
    root.chmod(0o755)
    (root / "ok.py").write_text("x = 1\n")
    (root / "dangling.so").symlink_to("/nonexistent/alternatives/libblas.so.3")
    (root / "secret.so").write_bytes(b"\0")
    (root / "secret.so").chmod(0o600)
    (root / "private" / "inside.so").write_bytes(b"\0")
    (root / "private").chmod(0o700)
    (root / "through-private.so").symlink_to(root / "private" / "inside.so")
    return root


def test_a_dangling_link_passes_and_what_the_id_cannot_read_is_named(as_root):
    root = tree(as_root)
    found = readable.check_as(NOBODY, [str(root)])
    assert found.above == []
    assert sorted(found.below) == sorted([str(root / "private"), str(root / "secret.so"),
                                          str(root / "through-private.so")])
    assert "dangling.so" not in readable.Readability(below=found.below).problem("auto")


def test_a_tree_the_id_can_read_whole_has_no_problem(as_root):
    root = tree(as_root)
    for unreadable in (root / "secret.so", root / "through-private.so"):
        unreadable.unlink()
    (root / "private").chmod(0o755)
    found = readable.check_as(NOBODY, [str(root)])
    assert (found.above, found.below) == ([], [])
    assert found.problem("auto") == ""


def test_inside_the_sandbox_debians_alternatives_resolve_as_outside(tmp_path):
    """A link of /etc/alternatives (Debian's, on this machine) points inside the sandbox where it
    points outside it, and every id may pass /etc to it (on a GPU node every rank was refused the
    Python's library folder's links, grading the whole machine unfit)."""
    if not os.path.isdir(bwrap.ALTERNATIVES) or not os.listdir(bwrap.ALTERNATIVES):
        pytest.skip("this machine has no alternatives links")
    try:
        binary = bwrap.find_bwrap()
    except Exception as e:  # noqa: BLE001 - whatever says there is no bwrap here
        skip_unless_required("A4_REQUIRE_TA_CONFIGS", f"no bwrap here: {e}")
    name = sorted(os.listdir(bwrap.ALTERNATIVES))[0]
    link = os.path.join(bwrap.ALTERNATIVES, name)
    staged = bwrap.stage(tmp_path / "staged", os.getuid(), os.getgid())
    argv, fds = bwrap.command(binary, staged, 16, ["/bin/sh", "-c", f'stat -c %a /etc {bwrap.ALTERNATIVES}; readlink "{link}"'])
    try:
        done = subprocess.run(argv, pass_fds=fds, capture_output=True, text=True, timeout=60)
    finally:
        for fd in fds:
            os.close(fd)
    assert done.returncode == 0, done.stderr
    etc_mode, alternatives_mode, target = done.stdout.split("\n")[:3]
    # Every user passes /etc (bwrap would make it 0700, its owner's: the ranks run under ids of their own).
    assert etc_mode == "755", done.stdout
    assert int(alternatives_mode, 8) & 0o005 == 0o005, done.stdout
    assert target == os.readlink(link)
