"""Graders as TAs are: an ordinary user (made with useradd; CI runs as root), with the kit and a
Python of their own, either from the system or, as pyenv, conda or a venv in ~ have it, entirely
under their private home directory.

`ta_setup(config)` makes one and returns how to run the grader as them; `remove(user)` undoes it.
The packages (torch and the rest) are hard links to this checkout's venv where the file system
allows, so a setup costs seconds, not a copy of a gigabyte.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.corpus import ROOT

KIT_PARTS = ("grader", "assignment_4", "requirements.txt")


@dataclass
class TA:
    user: str
    home: Path
    kit: Path          # the TA's copy of the kit
    python: Path       # the TA's venv's python

    def run(self, args: list, timeout: float, env: dict = None) -> subprocess.CompletedProcess:
        """`args` run as the TA, in their kit, with a login-like environment (plus `env`)."""
        extra = [f"{k}={v}" for k, v in (env or {}).items()]
        return subprocess.run(["runuser", "-u", self.user, "--", "env", "-i", f"HOME={self.home}",
                               "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", *extra, *args],
                              cwd=self.kit, capture_output=True, text=True, timeout=timeout)


def available() -> str:
    """Why TA configurations cannot be made here ('' when they can)."""
    if os.geteuid() != 0:
        return "making a user needs root (CI runs as root)"
    for tool in ("useradd", "userdel", "runuser"):
        if not shutil.which(tool):
            return f"{tool} is not installed"
    if not Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}").exists():
        return f"no system python{sys.version_info.major}.{sys.version_info.minor} to build the TA's Python from"
    return ""


def link_tree(src: Path, dst: Path, ignore=None) -> None:
    """dst as a copy of src whose files are hard links where possible, copies where not. Its
    bytecode comes along, as pip and a Python's installer write it: without it every start of the
    TA's Python compiles torch again (the TA cannot write into root's folders), 8 s instead of 2."""
    def link(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)
    shutil.copytree(src, dst, copy_function=link, symlinks=True, dirs_exist_ok=True, ignore=ignore)


def ta_setup(config: str, carry: tuple = ()) -> TA:
    """config "user": the system's Python, a venv outside the home directory;
    "user_home": a Python copied into the private home directory and a venv beside it.
    `carry`: more of the repository copied into the kit beside KIT_PARTS (a benchmark and its corpus).
    Hard-linked files stay root's (read only to the TA): only what the TA made is chowned."""
    user = f"a4ta{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", user], check=True, capture_output=True)
    home = Path(os.path.expanduser(f"~{user}"))
    os.chmod(home, 0o700)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    as_ta = ["runuser", "-u", user, "--"]
    if config == "user_home":
        base = home / "python"                 # as pyenv has it: bin/ and lib/pythonX.Y under ~
        (base / "bin").mkdir(parents=True)
        shutil.copy2(f"/usr/bin/{version}", base / "bin" / version)
        link_tree(Path(f"/usr/lib/{version}"), base / "lib" / version)
        venv, make = home / "venv", as_ta + [str(base / "bin" / version)]
    else:
        venv, make = Path(f"/var/tmp/{user}-venv"), [f"/usr/bin/{version}"]
    subprocess.run(make + ["-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    link_tree(Path(sysconfig.get_paths()["purelib"]), venv / "lib" / version / "site-packages")
    # torch's console script, as pip writes it into the venv it installs torch into
    torchrun = venv / "bin" / "torchrun"
    torchrun.write_text(f"#!{venv}/bin/python\nimport sys\nfrom torch.distributed.run import main\n"
                        "sys.exit(main())\n")
    torchrun.chmod(0o755)
    kit = home / "kit"
    kit.mkdir()
    for part in KIT_PARTS + tuple(carry):
        (kit / part).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, kit / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / part, kit / part)
    subprocess.run(["chown", "-R", f"{user}:{user}", str(kit)], check=True)
    return TA(user=user, home=home, kit=kit, python=venv / "bin" / "python")


def remove(ta: TA) -> None:
    subprocess.run(["pkill", "-KILL", "-u", ta.user], capture_output=True)
    subprocess.run(["userdel", "--remove", ta.user], capture_output=True)
    if not str(ta.python).startswith(str(ta.home)):
        shutil.rmtree(ta.python.parent.parent, ignore_errors=True)
