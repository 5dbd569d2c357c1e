"""Run a command as an ordinary user on a machine without user namespaces, as in a container whose
profile refuses them, or a cluster that turned them off, without changing the machine's setting.

    python -m tests.nouserns UID GID [--nproc N] [--threads K] -- COMMAND...   (as root)

The kernel's user.max_user_namespaces is a setting of each user namespace: a child of root's
namespace that maps root and the user (0 and UID to themselves) gets it set to 0, and the command
then runs in it as UID, with no capability. Every user namespace it asks for (bwrap, a world's own)
is refused (ENOSPC), exactly as where the setting is 0 for the machine; the namespace is the
user's whole world for RLIMIT_NPROC (the kernel counts tasks per user namespace), so `--threads K`
starts K idle threads of the user beside the command, in the same namespace, and `--nproc N` is
the user's `ulimit -u`. The exit status is the command's.
"""

import ctypes
import os
import resource
import subprocess
import sys

CLONE_NEWUSER = 0x10000000
IDLE = "import threading, time\nfor _ in range({n}):\n    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n" \
       "print('ready', flush=True)\ntime.sleep(3600)\n"


def _child(uid: int, gid: int, nproc: int, threads: int, command: list, ready_r: int, go_w: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
    os.write(go_w, b"1")
    os.read(ready_r, 1)   # the parent has written our maps
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")
    os.setgroups([])
    os.setgid(gid)
    if nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    os.setuid(uid)
    idle = None
    if threads:
        # the system's Python: the user may not be able to reach ours (a Python under /root)
        idle = subprocess.Popen(["/usr/bin/env", "python3", "-c", IDLE.format(n=threads)], stdout=subprocess.PIPE,
                                text=True)
        assert idle.stdout.readline().strip() == "ready"
    try:
        return subprocess.run(command).returncode
    finally:
        if idle is not None:
            idle.kill()
            idle.wait()


def main(argv: list) -> int:
    uid, gid = int(argv[0]), int(argv[1])
    split = argv.index("--")
    options, command = argv[2:split], argv[split + 1:]
    nproc = int(options[options.index("--nproc") + 1]) if "--nproc" in options else 0
    threads = int(options[options.index("--threads") + 1]) if "--threads" in options else 0
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            code = _child(uid, gid, nproc, threads, command, ready_r, go_w)
        except BaseException as e:  # noqa: BLE001 - say why, as a failed command would
            print(f"nouserns: {type(e).__name__}: {e}", file=sys.stderr)
            code = 125
        os._exit(code)
    assert os.read(go_r, 1) == b"1"
    for name, own in (("uid_map", uid), ("gid_map", gid)):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(f"0 0 1\n{own} {own} 1\n")
    os.write(ready_w, b"1")
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
