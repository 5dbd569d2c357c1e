"""The repository's tracked files: text the tree reads or builds from, and no binary it does not.

A binary (a wheel, an archive, a build output) committed by accident stays in every clone's history
for good; one the tree reads (test data) is named in ALLOWED with what reads it.
"""

import fnmatch
import subprocess

import pytest

from tests.corpus import ROOT

# Tracked binaries the tree reads: glob (relative to the top folder) -> what reads it. Test data from
# a cluster may hold raw bytes as a log does; nothing else is binary.
ALLOWED = {
    "tests/data/*": "the log readers' tests (tests/test_logs.py and others) read these files as a cluster left them",
}
SNIFF = 1 << 16   # bytes read from each file to tell text from binary


def tracked() -> list:
    """The files git tracks in this checkout, relative to ROOT."""
    try:
        done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("git is not installed: the tracked files cannot be listed")
    if done.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout (a copy of the kit): no tracked files to check")
    return [name for name in done.stdout.decode().split("\0") if name]


def is_binary(data: bytes) -> bool:
    """True for bytes that are not text: a NUL byte, or not UTF-8 (a cut at the end of the sniffed
    head does not count)."""
    if b"\0" in data:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start < len(data) - 4 or len(data) < SNIFF
    return False


def test_no_tracked_file_is_a_binary_the_tree_does_not_read():
    binaries = []
    for name in tracked():
        path = ROOT / name
        if not path.is_file() or path.is_symlink():
            continue
        with open(path, "rb") as f:
            if is_binary(f.read(SNIFF)) and not any(fnmatch.fnmatch(name, glob) for glob in ALLOWED):
                binaries.append(name)
    assert not binaries, (f"tracked binaries that nothing in the tree reads: {binaries}; remove them "
                          f"(git rm --cached), or name them in ALLOWED with what reads them")


@pytest.mark.parametrize("data, binary", [(b"", False), (b"plain text\n", False), ("é ü\n".encode(), False),
                                          (b"PK\x03\x04\x14\x00\x00\x00", True), (b"ab\xff\xfecd\n", True),
                                          (b"\x7fELF\x02\x01\x01\x00", True)])
def test_binary_files_are_told_from_text(data, binary):
    assert is_binary(data) == binary


def test_wheels_are_ignored():
    done = subprocess.run(["git", "check-ignore", "-q", "some-tool-1.0-py3-none-any.whl"], cwd=ROOT)
    if done.returncode == 128:
        pytest.skip(f"{ROOT} is not a git checkout")
    assert done.returncode == 0, ".gitignore must ignore *.whl"
