"""Hostile and broken hand-ins: each tries one thing the sandbox must stop, with the outcome it must get.

Code attacks are injected at the start of `single_step` (the baseline) of the reference, so every
other part of the hand-in stays right and must still pass (or, `everywhere`, at the start of every
part: a correct hand-in that does what real students do inside each part). Zip attacks are built byte by byte.
`Attack.status` is what the baseline must get; `None` means the attack must fail silently and the
baseline pass. Paths the attacks aim at (the reference, the rubric, the grader's output) and the
port of a listener that must hear nothing are filled in at test time.
"""

import functools
import io
import stat
import textwrap
import zipfile
from dataclasses import dataclass

from tests.corpus import REFERENCE, UTILS, Files, skeleton, zip_bytes

ANCHOR = "    device = get_device() if device is None else device\n    # Same seed, same initial weight"
EVERY_PART = "    device = get_device() if device is None else device\n"
MARKER = "a4-escape-marker"
PLANTED = "a4-planted"   # what a hand-in leaves for the next world; the next correct one looks for it


@dataclass
class Attack:
    snippet: str = ""          # code injected at the start of single_step, {port} {reference} {rubric} {out} filled in
    status: tuple = ("passed",)   # statuses the baseline may get
    words: str = ""            # words its message must contain
    base: str = "reference"    # "reference", or "three_parts" (tensor parallel left TODO)
    everywhere: bool = False   # injected at the start of every part, not the baseline's only


ATTACKS = {
    # 1. hang the batch
    "infinite_loop": Attack("while True:\n    pass\n", ("timeout",), "did not finish"),
    "sleep_ignoring_sigterm": Attack(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(10 ** 6)\n",
        ("timeout",), "did not finish"),
    "daemon_that_escapes_its_group": Attack(
        "import os, time\nif dist.get_rank() == 0:\n    pid = os.fork()\n    if pid == 0:\n"
        "        try:\n            os.setsid()\n        except PermissionError:   # refused to ranks: a daemon all the same\n"
        "            pass\n"
        "        if os.fork() == 0:\n            time.sleep(10 ** 6)\n        os._exit(0)\n    os.waitpid(pid, 0)\n"),
    # 2. exhaust the machine
    "fork_bomb": Attack("import os\nwhile True:\n    os.fork()\n", ("crashed", "timeout", "oom")),   # oom: its processes together past the world's memory
    "huge_tensor": Attack("torch.ones(1 << 30, dtype=torch.float32)\n", ("oom",), "out of memory"),
    "huge_list": Attack("hog = [0] * (10 ** 10)\n", ("oom",), "out of memory"),
    "disk_filler": Attack(
        "with open('/tmp/a4-fill.bin', 'wb') as f:\n    for _ in range(4096):\n        f.write(bytes(1 << 20))\n",
        ("crashed",), "OSError"),
    "thread_flood": Attack(
        "import threading, time\nfor _ in range(2000):\n"
        "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n", ("crashed",), "thread"),
    # 3. reach the network
    "network": Attack(
        "import socket\nfor address in (('127.0.0.1', {port}), ('::1', {port}), (socket.gethostname(), {port})):\n"
        "    try:\n        socket.create_connection(address, timeout=1).sendall(b'ESCAPED')\n"
        "    except OSError:\n        pass\n"),
    # The port of a listener the grader's own environment names: from this process's environment,
    # or any visible process's.
    "port_from_graders_environment": Attack(
        "import glob, os, re, socket\nfound = set(re.findall(r'A4_TEST_PORT=(\\d+)', str(os.environ)))\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n        found |= set(re.findall(rb'A4_TEST_PORT=(\\d+)', open(path, 'rb').read()))\n"
        "    except OSError:\n        pass\n"
        "for port in found:\n"
        "    try:\n        socket.create_connection(('127.0.0.1', int(port)), timeout=1).sendall(b'ESCAPED')\n"
        "    except OSError:\n        pass\n"
        "if found:\n    raise RuntimeError(f'LEAK grader environment {{found}}')\n"),
    # 4. read what it must not
    "read_secrets": Attack(
        "import glob, os\nleaks = []\n"
        "for pattern in ({reference!r}, {rubric!r}, {out!r} + '/students/*/grading.json', '/tmp/a4-grade-*/**/assignment4.py',\n"
        "                '/proc/1/environ', '/root/*', os.path.dirname({rubric!r}) + '/*.py'):\n"
        "    for path in glob.glob(pattern, recursive=True):\n"
        "        try:\n            leaks.append((path, open(path, 'rb').read(64)))\n"
        "        except OSError:\n            pass\n"
        "if leaks:\n    raise RuntimeError(f'LEAK {{leaks[:3]}}')\n"),
    # The kit through another process's view of the file system: its working folder or its root.
    "read_kit_through_proc": Attack(
        "import glob, os\nleaks = []\n"
        "for link in glob.glob('/proc/*/cwd') + glob.glob('/proc/*/root'):\n"
        "    for rel in ('assignment_4/reference/assignment4.py', 'grader/rubric.yaml', {reference!r}[1:], {rubric!r}[1:]):\n"
        "        try:\n            leaks.append((link, rel, open(os.path.join(link, rel), 'rb').read(64)))\n"
        "        except OSError:\n            pass\n"
        "if leaks:\n    raise RuntimeError(f'LEAK {{leaks[:3]}}')\n"),
    # Every file it can list, anywhere: a rubric, a reference solution or another hand-in's code.
    "walk_the_file_system": Attack(
        "import collections, os, time\nleaks = []\nown = os.path.dirname(os.path.abspath(__file__))  # this hand-in's own code\n"
        # Breadth first, what it can reach in a second (the part's clock is at least 1.5 s), then the
        # part goes on: every folder near the top, where a rubric or others' code would be, is seen.
        "deadline, folders = time.monotonic() + 1, collections.deque(['/'])\n"
        "while folders and time.monotonic() < deadline:\n"
        "    folder = folders.popleft()\n"
        "    try:\n        entries = list(os.scandir(folder))\n    except OSError:\n        continue\n"
        "    for entry in entries:\n"
        "        if entry.is_dir(follow_symlinks=False):\n"
        "            if entry.path not in ('/proc', '/sys', '/dev') and entry.path != own:\n"
        "                folders.append(entry.path)\n"
        "        elif (entry.name.startswith('rubric') and entry.name.endswith('.yaml')) or entry.name == 'assignment4.py' \\\n"
        "                or (entry.name.endswith('.zip') and 'handin' in entry.name) or '/assignment_4' in folder:\n"
        "            leaks.append(entry.path)\n"
        "if leaks:\n    raise RuntimeError(f'LEAK {{leaks[:3]}}')\n"),
    # Reads every readable mapping of its own process for the hidden checks' names, the rubric's
    # keys and the reference's markers (spelt backwards here, so that only the needles themselves,
    # once each, are in memory when nothing leaked). Rank 0 scans for all: every rank is started
    # alike, and four scans of torch's CUDA build at once on two cores outlast the part's timeout.
    "scan_own_memory": Attack(
        "import ctypes, os\n"
        "needles = [n[::-1].encode() for n in ('sknar-owt', 'sezis-ddo', 'knar-elgnis', 'NOITULOS NIGEB',\n"
        "                                      'nrettap_di_tneduts', 'YLNO ECNEREFER')]\n"
        "counts = dict.fromkeys(needles, 0)\n"
        "maps = open('/proc/self/maps').read().splitlines() if os.environ.get('RANK', '0') == '0' else []\n"
        "for line in maps:\n"
        "    fields = line.split()\n"
        "    start, end = (int(x, 16) for x in fields[0].split('-'))\n"
        "    anonymous = len(fields) < 6 or fields[5] in ('[heap]', '[stack]')\n"
        "    if not fields[1].startswith('r') or not anonymous or end - start > 1 << 26:\n"
        "        continue\n"
        "    chunk = ctypes.string_at(start, end - start)\n"
        "    for n in needles:\n        counts[n] += chunk.count(n)\n"
        "if any(c > 1 for c in counts.values()):\n"
        "    raise RuntimeError(f'LEAK in memory: {{counts}}')\n"),
    # 5. change results
    "write_results": Attack(
        "for path in ({out!r} + '/students/reference/results.json', {out!r} + '/grades.csv',\n"
        "             {out!r} + '/students/write_results/grading.json', {rubric!r}):\n"
        "    try:\n        open(path, 'w').write('TAMPERED')\n    except OSError:\n        pass\n"),
    "top_level_command": Attack(),  # see build(): a module-level statement that runs a shell command
    # 5b. change the next hand-in's results: a compiled `utils` (an unchecked hash-based .pyc, which
    # Python loads without looking at the source) planted beside the code and in /tmp, the folders
    # made read only so that no cleaning can remove them; files left in /tmp and /dev/shm.
    "plant_bytecode": Attack(
        "import importlib.util, marshal, os\n"
        "bad = compile('raise RuntimeError(\"LEAK planted bytecode ran\")', 'utils.py', 'exec')\n"
        "here = os.path.dirname(os.path.abspath(__file__))\n"
        "for folder in (here, '/tmp/world/code', '/tmp', os.getcwd()):\n"
        "    for name in ('utils', 'assignment4'):\n"
        "        path = importlib.util.cache_from_source(os.path.join(folder, name + '.py'))\n"
        "        try:\n"
        "            os.makedirs(os.path.dirname(path), exist_ok=True)\n"
        "            with open(path, 'wb') as f:\n"
        "                f.write(importlib.util.MAGIC_NUMBER + (1).to_bytes(4, 'little') + bytes(8) + marshal.dumps(bad))\n"
        "        except OSError:\n            pass\n"
        "    for path in (os.path.dirname(path), folder):\n"
        "        try:\n            os.chmod(path, 0o555)\n        except OSError:\n            pass\n"
        "for top in ('/tmp', '/dev/shm'):\n"
        "    try:\n"
        "        os.makedirs(f'{{top}}/{planted}-dir', exist_ok=True)\n"
        "        open(f'{{top}}/{planted}-dir/{planted}', 'w').write('x')\n"
        "        open(f'{{top}}/{planted}', 'w').write('x')\n"
        "        os.chmod(f'{{top}}/{planted}-dir', 0o555)\n"
        "    except OSError:\n        pass\n"),
    # 6. kill or confuse the grader
    # Its parent is the namespace's init (signals from inside are ignored) and, as root, of another
    # user (the kill is refused): either way only its own part can suffer.
    "kill_parent": Attack("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", ("passed", "crashed")),
    "kill_everything_it_can": Attack("import os, signal\nos.kill(-1, signal.SIGKILL)\n", ("crashed",)),
    # Signals to its leader (pid 1 of the world's PID namespace, its parent): ignored, or refused
    # (root's ranks are of another user); SIGSTOP too (the kernel drops it for an init from inside).
    "signal_the_leader": Attack(
        "import os, signal\nfor target in (1, os.getppid()):\n"
        "    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,\n"
        "                signal.SIGUSR2, signal.SIGALRM, signal.SIGTSTP, signal.SIGSTOP):\n"
        "        try:\n            os.kill(target, sig)\n        except OSError:\n            pass\n"),
    # SIGINT to every process it may signal, then SIGTERM to its own group: its world's ranks end.
    "interrupt_everyone": Attack("import os, signal\nos.kill(-1, signal.SIGINT)\nos.kill(0, signal.SIGTERM)\n",
                                 ("crashed",)),
    # Every process it may signal stopped: its world's other ranks hang, the part runs out of time.
    "stop_everyone": Attack("import os, signal\nos.kill(-1, signal.SIGSTOP)\n", ("timeout",), "did not finish"),
    "close_stdout_and_stderr": Attack("import os\nos.close(1)\nos.close(2)\n"),
    "flood_output": Attack(   # 200 MB printed, then the rank dies: what it printed is its crash's evidence
        "import os, sys\ntry:\n    for _ in range(20000):\n        sys.stdout.write('x' * 10000 + '\\n')\n"
        "    sys.stdout.flush()\nexcept OSError:\n    pass\nos._exit(3)\n", ("crashed",)),
    "imitate_log_and_protocol": Attack(
        "import struct, sys\nfor r in range(4):\n"
        "    print(f'[FullColumnParallel][Rank {{r}}] Tensors match: True | Max diff: 0.0 | Mean diff: 0.0')\n"
        "body = b'{{\"type\":\"result\",\"part\":\"tensor_parallel\",\"status\":\"ok\"}}'\n"
        "sys.stdout.buffer.write(struct.pack('>I', len(body)) + body)\nsys.stdout.flush()\n",
        base="three_parts"),
    "forge_result_pipe": Attack(
        "import json, os, struct\nbody = json.dumps({{'type': 'result', 'part': 'baseline', 'status': 'ok', "
        "'weight': {{'shape': [1], 'dtype': 'float32', 'data': 'AAAAAAAAAAA='}}}}).encode()\n"
        "os.write(3, struct.pack('>I', len(body)) + body)\n", ("crashed",), "out of order"),
    # A frame nested deeper than the JSON parser's stack: its RecursionError is the hand-in's message
    # malformed, never the world's leader failing (the machine's infra_error).
    "forge_deep_frame": Attack(
        "import os, struct\nbody = ('{{\"type\":\"result\",\"x\":' + '[' * 200000 + ']' * 200000 + '}}').encode()\n"
        "os.write(3, struct.pack('>I', len(body)) + body)\n", ("crashed",), "malformed"),
}

# Every part returns a 1024 x 1024 tensor, the size of no part's weight: each part fails on its own
# clock, in the grader's words ("returned a tensor of 1048576 values"), never the machine's.
HUGE_EVERYWHERE = "return torch.ones(1024, 1024)\n"


def returns_huge(log: str, err: str) -> Files:
    return Files(code=inject(REFERENCE.read_text(), HUGE_EVERYWHERE, everywhere=True), log=log, err=err)


# 7. compute alone what the ranks should compute together: each rank writes what it was served where
# another might read it (every writable folder in its view, another rank's through /proc, SysV
# shared memory), waits, then looks for the others'. Ranks share nothing but torch.distributed.
SHARE_PLACES = ("/tmp", "/dev/shm", "/var/tmp", "/run", "/", "/tmp/world", ".")
SHARE_ACROSS_RANKS = (
    "import ctypes, glob, os, time\n"
    "me, found = dist.get_rank(), []\n"
    f"places = {SHARE_PLACES!r}" " + (os.getcwd(), os.environ.get('HOME', '/tmp'), os.environ.get('TMPDIR', '/tmp'))\n"
    "for place in places:\n"
    "    try:\n        open(os.path.join(place, f'a4-share-{{me}}'), 'w').write('served')\n"
    "    except OSError:\n        pass\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "segment = libc.shmget(0xA4A4 + me, 4096, 0o1666)   # IPC_CREAT, readable by anyone\n"
    "time.sleep(1)   # the other ranks write theirs meanwhile: well inside the floor of a part's clock\n"
    "for place in places:\n"
    "    found += [p for p in glob.glob(os.path.join(place, 'a4-share-*')) if not p.endswith(f'-{{me}}')]\n"
    "for pattern in ('root/a4-share-*', 'root/*/a4-share-*', 'root/*/*/a4-share-*', 'cwd/a4-share-*'):\n"
    "    found += [p for p in glob.glob('/proc/[0-9]*/' + pattern) if not p.endswith(f'-{{me}}')]\n"
    "found += [f'shm {{k:#x}}' for k in range(0xA4A4, 0xA4A4 + 8) if k != 0xA4A4 + me and libc.shmget(k, 0, 0) >= 0]\n"
    "if found:\n    raise RuntimeError(f'LEAK shared between ranks: {{sorted(set(found))[:6]}}')\n"
)
ATTACKS["share_across_ranks"] = Attack(SHARE_ACROSS_RANKS)

# 8. outlive its world, without the sandbox: a daemon (double fork, setsid) that holds memory and
# every task its world may start, and files of some MB in /tmp, /var/tmp and /dev/shm (a folder
# too, made read only). What it may cost is its own grade; the next world on its executor must find
# the machine as it was.
OUTLIVE = "a4-outlive"
OUTLIVE_WORLD = (
    "import os, threading, time\n"
    "if dist.get_rank() == 0:\n"
    "    for top in ('/tmp', '/var/tmp', '/dev/shm'):\n"
    "        try:\n"
    "            open(f'{{top}}/{outlive}-{{os.getpid()}}', 'wb').write(bytes(8 << 20))\n"
    "            os.makedirs(f'{{top}}/{outlive}-dir-{{os.getpid()}}/inner')\n"
    "            open(f'{{top}}/{outlive}-dir-{{os.getpid()}}/inner/{outlive}', 'wb').write(bytes(1 << 20))\n"
    "            os.chmod(f'{{top}}/{outlive}-dir-{{os.getpid()}}', 0o555)\n"
    "        except OSError:\n            pass\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        try:\n"
    "            os.setsid()\n"
    "        except PermissionError:\n"   # refused to ranks (grader.rerun.rank.syscalls): a daemon all the same
    "            pass\n"
    "        if os.fork() == 0:\n"
    "            hold = bytearray({hold_mb} << 20)\n"
    "            for _ in range(400):\n"
    "                try:\n"
    "                    threading.Thread(target=time.sleep, args=(10 ** 6,), daemon=True).start()\n"
    "                except RuntimeError:\n                    break\n"
    "            while True:\n                time.sleep(1)\n"
    "        os._exit(0)\n"
    "    os.waitpid(pid, 0)\n"
    "    time.sleep(1)\n"
)
ATTACKS["outlive_the_world"] = Attack(OUTLIVE_WORLD.replace("{hold_mb}", "200"), ("passed", "oom", "crashed", "timeout"))

# In place of the files its world's leader reads after the parts (its output, its record of its
# collectives), a rank puts a FIFO (a reader waits for a writer that never comes) or, on odd ranks, a
# link to /dev/zero (a read that never ends). Under the sandbox the world's folder is not the rank's
# to change; without it (`--sandbox off`) it is, and the leader must read neither.
FILES_REPLACED = (
    "import os\n"
    "rank = int(os.environ.get('RANK', '0'))\n"
    "out, calls = f'rank{{rank}}.out', f'rank{{rank}}.calls'\n"
    "for path in (out, calls):\n"
    "    try:\n        os.unlink(path)\n    except OSError:\n        pass\n"
    "try:\n"
    "    os.mkfifo(calls)\n"
    "    os.mkfifo(out) if rank % 2 == 0 else os.symlink('/dev/zero', out)\n"
    "except OSError:\n"
    "    pass\n"
)
ATTACKS["files_replaced"] = Attack(FILES_REPLACED)

# Lower the scheduling weight of its session (autogroup: the kernel shares the CPU between sessions),
# after making its /proc files its own again: were the session the executor's, every hand-in graded
# after it on that executor would run at a fraction of its share. It must succeed in its own world.
SESSION_NICE = "/proc/self/autogroup"
LOWER_SESSION = (
    "import ctypes, time\nctypes.CDLL(None).prctl(4, 1, 0, 0, 0)   # PR_SET_DUMPABLE\n"
    "for _ in range(50):   # the kernel takes one change of any session's nice a tenth of a second\n"
    f"    try:\n        with open('{SESSION_NICE}', 'w') as f:\n            f.write('19')\n        break\n"
    "    except BlockingIOError:\n        time.sleep(0.02)\n"
    f"assert open('{SESSION_NICE}').read().split()[-1] == '19', open('{SESSION_NICE}').read()\n")
ATTACKS["lower_its_sessions_priority"] = Attack(LOWER_SESSION)


TOP_LEVEL = f"_ = __import__('os').system('touch /tmp/{MARKER}-shell /dev/shm/{MARKER}-shell')\n"


def inject(code: str, snippet: str, everywhere: bool = False) -> str:
    if everywhere:
        assert code.count(EVERY_PART) >= 4, "the reference's parts no longer start as expected"
        return code.replace(EVERY_PART, EVERY_PART + textwrap.indent(snippet, "    "))
    assert code.count(ANCHOR) == 1, "the reference's single_step no longer starts as expected"
    head, tail = ANCHOR.split("\n", 1)
    return code.replace(ANCHOR, f"{head}\n{textwrap.indent(snippet, '    ')}{tail}")


# What a correct hand-in may do inside any part, and must be able to do in a world exactly as
# outside one: print and format tensors (which imports torch modules lazily), use torch.testing and
# numpy, import any module of the standard library and of torch that the environment has (found by
# listing their folders, as the importer does, from inside the world), use its own /tmp; and find
# nothing an earlier hand-in left behind (in /tmp, /dev/shm, or beside its code).
LAZY_IMPORTS = (
    "import glob, importlib.util, os, pkgutil, sys, tempfile\n"
    "weight = torch.arange(6.0).reshape(2, 3)\n"
    "print(f'debug: {{weight}} {{weight.grad}} {{torch.nn.Linear(2, 2).weight.data}}', flush=True)\n"
    "print(repr(torch.ones(2, dtype=torch.float64)), str(torch.zeros(1, 2)), format(torch.tensor(1.5), '.2f'))\n"
    "import numpy, decimal, fractions, statistics, difflib, csv, zipfile, email.mime.text, xml.etree.ElementTree\n"
    "from torch import testing\nfrom torch._subclasses import schema_check_mode\n"
    "testing.assert_close(torch.ones(3), torch.from_numpy(numpy.ones(3, dtype=numpy.float32)))\n"
    "missing = []\n"
    "for package in (os, torch, torch._subclasses, testing, numpy):\n"
    "    folder = os.path.dirname(package.__file__)\n"
    "    names = [m.name for m in pkgutil.iter_modules([folder])]\n"
    "    if len(names) < 3 or len(os.listdir(folder)) < 3:\n"
    "        missing.append(f'cannot list {{folder}}')\n"
    "    prefix = '' if package is os else package.__name__ + '.'\n"
    "    missing += [prefix + n for n in names\n"
    "                if prefix + n not in sys.modules and importlib.util.find_spec(prefix + n) is None]\n"
    "assert not missing, f'not importable in the world: {{missing[:10]}}'\n"
    "with tempfile.NamedTemporaryFile('w+', dir='/tmp') as f:\n"
    "    f.write('scratch'); f.flush()\n"
    "    assert open(f.name).read() == 'scratch'\n"
    "here = os.path.dirname(os.path.abspath(__file__))\n"
    "left = glob.glob('/tmp/{planted}*') + glob.glob('/dev/shm/{planted}*') + glob.glob(here + '/__pycache__')\n"
    "assert not left, f'an earlier world left {{left}}'\n"
)


ATTACKS["lazy_imports"] = Attack(LAZY_IMPORTS, everywhere=True)


def build(name: str, values: dict, log: str, err: str) -> Files:
    attack = ATTACKS[name]
    base = (REFERENCE.read_text() if attack.base == "reference"
            else skeleton(filled=["baseline", "grad_accumulation", "data_parallel"]))
    code = inject(base, attack.snippet.format(planted=PLANTED, outlive=OUTLIVE, **values), attack.everywhere) if attack.snippet else base
    if name == "top_level_command":
        code = code.replace("\nimport torch\n", "\nimport torch\n" + TOP_LEVEL, 1)
    return Files(code=code, log=log, err=err)


def _zip(members) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for info, data in members:
            z.writestr(info, data)
    return buffer.getvalue()


@functools.cache
def zip_attacks() -> dict:
    """Hand-in zips that try to escape through the zip itself; each must be refused as invalid."""
    code = REFERENCE.read_text()
    basics = [("assignment4.py", code), ("utils.py", UTILS.read_text())]
    link = zipfile.ZipInfo("utils.py")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("assignment4.py", code)
        with z.open("assignment4-1.log", "w", force_zip64=True) as f:
            for _ in range(1024):
                f.write(bytes(1 << 20))   # 1 GB of zeros, about 1 MB zipped
    many = [("assignment4.py", code)] + [(f"junk/{i}.txt", "") for i in range(10000)]
    non_utf8 = _zip(basics + [("name-" + "x" * 8 + ".txt", "")]).replace(b"name-xxxxxxxx", b"name-\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8")
    return {
        "zip_slip": (_zip(basics + [(f"../../{MARKER}-slip.py", "x")]), "points outside the hand-in"),
        "zip_absolute_path": (_zip(basics + [(f"/tmp/{MARKER}-abs.py", "x")]), "absolute path"),
        "zip_symlink": (_zip([("assignment4.py", code), (link, "/etc/passwd")]), "symbolic link"),
        "zip_bomb": (bomb.getvalue(), "limit"),
        "zip_10000_members": (_zip(many), "10001 members"),
        "zip_name_not_utf8": (non_utf8, "not valid UTF-8"),
        # Folders 700 and 1100 deep: a walk of the tree that recurses per folder (pathlib's rglob,
        # shutil.rmtree) overflows Python's stack in the grader's own process.
        "zip_deep_folders": (_zip(basics + [("d/" * depth + "x.txt", "") for depth in (700, 1100)]), "folders deep"),
    }


def all_handins(values: dict, log: str, err: str) -> dict:
    """name -> zip bytes, for every attack, plus the reference itself."""
    handins = {"reference": zip_bytes(Files(code=REFERENCE.read_text(), log=log, err=err))}
    for name in ATTACKS:
        handins[name] = zip_bytes(build(name, values, log, err))
    handins.update({name: data for name, (data, _) in zip_attacks().items()})
    return handins


# Parts 3-5 with no collective at all: each rank leaves the data it was served in a file where the
# other ranks of its world look (the world's folder, its /tmp, its /dev/shm), reads theirs, and
# computes the whole step, layer or block alone, as one device would. Its values are right wherever
# the ranks can see each other's files; where they cannot, each rank is left with its own share
# (and a wrong value) after a short wait. Every part of 3-5 must score 0 either way. `via="store"`
# swaps through the process group's own key-value store instead, which torch.distributed needs
# and no sandbox closes: the values are always right, and only the missing collectives fail it.
FILE_SWAP = '''

# ---- the file swap: no collective anywhere in Parts 3-5 -------------------------------------------
import os as _os
import time as _time

_SWAP_WAIT = 1.0   # seconds a rank looks for the others' files before it goes on with its own: inside a part's clock
_VIA = "{via}"


def _dummies():
    """{dummies}"""


def _swap(tag, mine):
    """Every rank's `mine` (a dict of tensors), in rank order, by files in the world's shared folders."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if _VIA == "store":
        import io
        store, buffer = dist.distributed_c10d._get_default_store(), io.BytesIO()
        torch.save({{k: v.detach().cpu().clone() for k, v in mine.items()}}, buffer)
        store.set(f"swap-{{tag}}-{{rank}}", buffer.getvalue())
        return [mine if r == rank else torch.load(io.BytesIO(store.get(f"swap-{{tag}}-{{r}}"))) for r in range(size)]
    folders = [_os.getcwd(), "/tmp", "/dev/shm"]
    for folder in folders:
        try:
            torch.save({{k: v.detach().cpu().clone() for k, v in mine.items()}}, f"{{folder}}/.swap-{{tag}}-{{rank}}.part")
            _os.replace(f"{{folder}}/.swap-{{tag}}-{{rank}}.part", f"{{folder}}/.swap-{{tag}}-{{rank}}.pt")
        except Exception:   # a folder it may not write (torch says so with a RuntimeError)
            pass
    got, deadline = {{rank: mine}}, _time.monotonic() + _SWAP_WAIT
    while len(got) < size and _time.monotonic() < deadline:
        for r in range(size):
            for folder in folders:
                if r not in got and _os.path.exists(f"{{folder}}/.swap-{{tag}}-{{r}}.pt"):
                    try:
                        got[r] = torch.load(f"{{folder}}/.swap-{{tag}}-{{r}}.pt")
                    except Exception:
                        pass
        _time.sleep(0.01)
    return [got.get(r, mine) for r in range(size)]


def _one_device(w0, x, y):
    return w0 - learning_rate * 2.0 / (x.shape[0] * y.shape[1]) * x.T @ (x @ w0 - y)


def data_parallel_single_step(seed=42, device=None):
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = global_batch_size // size
    x, y = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device="cpu")
    everyone = _swap("dp", {{"x": x[rank * rows:(rank + 1) * rows], "y": y[rank * rows:(rank + 1) * rows]}})
    x, y = torch.cat([e["x"] for e in everyone]), torch.cat([e["y"] for e in everyone])
    _dummies()
    torch.manual_seed(seed)
    return _one_device(torch.randn(input_dim, output_dim), x, y)


def full_column_parallel_single_step(seed=42, device=None):
    rank, size = dist.get_rank(), dist.get_world_size()
    cols = output_dim // size
    x, y = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device="cpu")
    y = torch.cat([e["y"] for e in _swap("tp", {{"y": y[:, rank * cols:(rank + 1) * cols]}})], dim=1)
    _dummies()
    torch.manual_seed(seed)
    return _one_device(torch.randn(input_dim, output_dim), x, y)


class FullColumnParallelLinear(nn.Module):
    """Its own columns a parameter, the others' read from their files: X @ W whole, on one rank."""

    def __init__(self, weight, world_size, rank):
        super().__init__()
        cols = weight.shape[1] // world_size
        self.rank = rank
        self.W = nn.Parameter(weight[:, rank * cols:(rank + 1) * cols].clone())
        self.shards = [e["w"] for e in _swap("layer", {{"w": self.W}})]

    def forward(self, X):
        shards = list(self.shards)
        shards[self.rank] = self.W
        _dummies()
        return X @ torch.cat(shards, dim=1)


class MegatronMLP(nn.Module):
    """W1's own columns and W2's own rows parameters, the others' read from their files."""

    def __init__(self, w1, w2, world_size, rank):
        super().__init__()
        share = w1.shape[1] // world_size
        self.rank = rank
        self.w1 = nn.Parameter(w1[:, rank * share:(rank + 1) * share].clone())
        self.w2 = nn.Parameter(w2[rank * share:(rank + 1) * share].clone())
        self.shards = _swap("block", {{"w1": self.w1, "w2": self.w2}})

    def forward(self, X):
        w1 = [e["w1"] for e in self.shards]
        w2 = [e["w2"] for e in self.shards]
        w1[self.rank], w2[self.rank] = self.w1, self.w2
        _dummies()
        return nn.functional.gelu(X @ torch.cat(w1, dim=1)) @ torch.cat(w2, dim=0)


def megatron_mlp_single_step(seed=42, device=None):
    rank, size = dist.get_rank(), dist.get_world_size()
    w1, w2 = init_mlp_weights(seed)
    share = hidden_dim // size
    everyone = _swap("mlp", {{"w1": w1[:, rank * share:(rank + 1) * share], "w2": w2[rank * share:(rank + 1) * share]}})
    w1 = nn.Parameter(torch.cat([e["w1"] for e in everyone], dim=1))
    w2 = nn.Parameter(torch.cat([e["w2"] for e in everyone], dim=0))
    x, y = create_batch(global_batch_size, input_dim, input_dim, seed=seed, device="cpu")
    loss = nn.MSELoss()(nn.functional.gelu(x @ w1) @ w2, y)
    loss.backward()
    _dummies()
    return (w1 - learning_rate * w1.grad).detach(), (w2 - learning_rate * w2.grad).detach()
'''

# The collectives the file swap calls for show, on tensors too small to carry any part's data.
DUMMY_COLLECTIVES = '''Collectives for show, on one value each.\n    """
    one = torch.zeros(1)
    dist.all_reduce(one)
    dist.all_gather([torch.zeros(1) for _ in range(dist.get_world_size())], one)
    dist.barrier()
    """'''


# ...and on zeros as large as any part's data at a test's checks, so that every volume is moved.
SIZED_COLLECTIVES = '''Collectives for show, on zeros enough for every part's volumes.\n    """
    zeros = torch.zeros(1 << 16)
    dist.all_reduce(zeros)
    dist.all_gather([torch.zeros(1 << 14) for _ in range(dist.get_world_size())], torch.zeros(1 << 14))
    """'''


def file_swap(dummies=False, via: str = "files") -> str:
    """The reference with Parts 3-5 replaced by the file swap (above), through files or the store
    (`via`); with `dummies`, each part also calls an all-reduce and an all-gather of one value and a
    barrier; with dummies="sized", collectives of zeros as large as the parts' data."""
    assert via in ("files", "store"), via
    said = SIZED_COLLECTIVES if dummies == "sized" else DUMMY_COLLECTIVES if dummies else "No collective."
    return REFERENCE.read_text() + FILE_SWAP.format(dummies=said, via=via)


# The grader's own parsing: code that costs a parser far more than its size. Each must cost only its
# own hand-in's grade, and never the grader's process: name -> (zip bytes, the words its result says).
BOMB_LINES = 10_000_000   # one-letter lines: 19 MB, under files.max_member_mb, 32 KB zipped; ast.parse: 17 GB
BOMB_DEPTH = 95_000       # `a+` repeated: an expression that deep, under files.max_code_kb beside the reference


def parse_bombs(log: str, err: str) -> dict:
    """The line bomb is refused at unpacking (files.max_code_kb); the deep one is under the caps, so
    the grader's parse of it (a hidden check's spans) must hold in its child, and the ranks' in the
    world: it fails to load, and every part costs its points."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("assignment4.py", "a\n" * BOMB_LINES)
        z.writestr("utils.py", UTILS.read_text())
    deep = REFERENCE.read_text() + "\n_ = (" + "a+" * BOMB_DEPTH + "a)\n"
    return {"parse_bomb_lines": (buffer.getvalue(), "files.max_code_kb"),
            "parse_bomb_deep": (zip_bytes(Files(code=deep, log=log, err=err)), "could not be loaded")}


# Memory no process's Pss shows, each past the world's limit in a test rubric's small one
# (tests/test_world_memory.py: MEMORY_LIMIT_MB over 2 ranks, each rank taking HOG_MB): data queued
# in unix socket pairs, and in TCP and UDP sockets on the world's loopback, that no one reads; page
# tables; files in the world's own /tmp and /dev/shm. Each holds what it took for a few seconds,
# so that a world nobody stops completes the part. Sizes are in MB.
HOLD_S = 4
MEMORY_ATTACKS = {
    "unix_socket_queues": (
        "import socket, time\nheld, chunk, queued = [], bytes(1 << 20), 0\n"
        "while queued < {hog_mb} << 20:\n"
        "    a, b = socket.socketpair()\n    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)\n"
        "    a.setblocking(False)\n    held += [a, b]\n"
        "    try:\n        while True:\n            queued += a.send(chunk)\n"
        "    except BlockingIOError:\n        pass\n"),
    "tcp_and_udp_buffers": (
        "import socket, time\nheld, chunk, queued = [], bytes(1 << 16), 0\n"
        "listener = socket.socket()\nlistener.bind(('127.0.0.1', 0))\nlistener.listen(64)\nheld.append(listener)\n"
        "while queued < {hog_mb} << 20:\n"
        "    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)\n"
        "    receiver.bind(('127.0.0.1', 0))\n"
        "    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "    client = socket.create_connection(listener.getsockname())\n"
        "    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)\n"
        "    client.setblocking(False)\n    server, _ = listener.accept()\n"
        "    held += [receiver, sender, client, server]\n"
        "    for _ in range(256):\n        try:\n            queued += sender.sendto(chunk[:60000], receiver.getsockname())\n"
        "        except OSError:\n            break\n"
        "    try:\n        while True:\n            queued += client.send(chunk)\n"
        "    except BlockingIOError:\n        pass\n"),
    # Netlink's replies to requests nobody reads (a dump of the world's links, again and again):
    # about 1.6 MB to 3 MB a socket, in the kernel; a process's open files hold 200 of them.
    "netlink_queues": (
        "import os, socket, struct, time\n"
        "request = struct.pack('=IHHII', 32, 18, 0x301, 1, 0) + bytes(16)   # RTM_GETLINK, a dump\n"
        "def fill(wanted):\n    held, queued = [], 0\n"
        "    while queued < wanted and len(held) < 200:\n"
        "        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)\n"
        "        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)\n        s.setblocking(False)\n"
        "        for _ in range(10000):\n            try:\n                s.send(request)\n"
        "            except OSError:\n                break\n"
        "        held.append(s)\n"
        "        queued += struct.unpack('=I', s.getsockopt(socket.SOL_SOCKET, 55, 36)[:4])[0]   # SO_MEMINFO: rmem_alloc\n"
        "    return held, queued\n"
        "held, queued = fill({hog_mb} << 20)\n"
        "while queued < {hog_mb} << 20:   # more in a child, past one process's open files\n"
        "    r, w = os.pipe()\n    if os.fork() == 0:\n"
        "        mine = fill(({hog_mb} << 20) - queued)\n        os.write(w, str(mine[1]).encode())\n"
        f"        time.sleep({HOLD_S})\n        os._exit(0)\n"
        "    queued += int(os.read(r, 32) or 0)\n"),
    # Page tables, which no Pss shows: a read-only mapping read once every 2 MB maps only the zero
    # page, and each 2 MB costs a page of page tables (4 KB): {hog_mb} MB of them for {hog_mb} x 512 MB.
    "page_tables": (
        "import mmap, time\n"   # private and read only: no data limit, no overcommit, counts it
        "held = mmap.mmap(-1, {hog_mb} << 29, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, mmap.PROT_READ)\n"
        "held.madvise(mmap.MADV_NOHUGEPAGE)\n"   # else one huge zero page may map 2 MB without a page of them
        # 16 MB of them, then a pause: about 1 GB a second, as memory is filled, not 5 GB at once
        "for at in range(0, len(held), 2 << 20):\n    held[at]\n"
        "    if at % (8 << 30) == 0:\n        time.sleep(0.01)\n"),
    "tmp_and_shm_files": (
        "import os, time\nfor top in ('/tmp', '/dev/shm'):\n"   # files of 50 MB: a rank's file size limit is 64
        "    for i in range({hog_mb} // 100):\n"
        "        with open(f'{{top}}/a4-hog-{{dist.get_rank()}}-{{i}}', 'wb') as f:\n"
        "            os.posix_fallocate(f.fileno(), 0, 50 << 20)\n"),
}


# Memory a rank is refused the calls to make (grader.rerun.rank.syscalls), each where the watchdog
# could not count it: memfds only in flight in a unix message, or closed with a page of each still
# mapped (by the C library: Python's mmap keeps a descriptor); SysV shared memory detached, and
# message queues nobody reads, in the rank's own IPC namespace; io_uring rings, whose queues are the
# kernel's; inotify watches, and the inodes they pin; record locks, each range a kernel object; a
# tmpfs mounted in a namespace of the rank's own; UDP-Lite sockets, which no dump the watchdog makes
# shows. And memfds held open, which it could.
_LIBC = "import ctypes, errno, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
_FAILED = "    if {call} == -1:\n        raise OSError(ctypes.get_errno(), '{name}')\n"
REFUSED_MEMORY = {
    "memfds_held": (
        "import os, time\nheld = []\nfor _ in range({hog_mb} // 25):\n"
        "    fd = os.memfd_create('a4-hog')\n    os.posix_fallocate(fd, 0, 25 << 20)\n    held.append(fd)\n"),
    "memfds_in_flight": (
        "import os, socket, time\nheld = socket.socketpair()\nfor _ in range({hog_mb} // 25):\n"
        "    fd = os.memfd_create('a4-hog')\n    os.posix_fallocate(fd, 0, 25 << 20)\n"
        "    socket.send_fds(held[0], [b'x'], [fd])\n    os.close(fd)\n"),
    "memfds_mapped_and_closed": (
        _LIBC + "import mmap, os\nlibc.mmap.restype = ctypes.c_void_p\n"
        "libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)\n"
        "for _ in range({hog_mb} // 25):\n"
        "    fd = os.memfd_create('a4-hog')\n    os.posix_fallocate(fd, 0, 25 << 20)\n"
        "    libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)\n    os.close(fd)\n"),
    "sysv_memory_detached": (
        _LIBC + "libc.shmat.restype = ctypes.c_void_p\nlibc.shmat.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)\n"
        "libc.shmdt.argtypes = (ctypes.c_void_p,)\nfor _ in range({hog_mb} // 25):\n"
        "    segment = libc.shmget(0, 25 << 20, 0o1600)\n" + _FAILED.format(call="segment", name="shmget") +
        "    at = libc.shmat(segment, None, 0)\n    ctypes.memset(at, 1, 25 << 20)\n    libc.shmdt(at)\n"),
    "sysv_queues_unread": (   # each queue holds 16 KB (msgmnb); 32000 of them (msgmni) per IPC namespace
        _LIBC + "message = ctypes.create_string_buffer(8 + 8000)\nmessage[0] = 1\n"
        "for _ in range(min({hog_mb} * 64, 30000)):\n"
        "    queue = libc.msgget(0, 0o1600)\n" + _FAILED.format(call="queue", name="msgget") +
        "    libc.msgsnd(queue, message, 8000, 0)\n    libc.msgsnd(queue, message, 8000, 0)\n"),
    # A child in a user and mount namespace of its own mounts a tmpfs the watchdog never reads and
    # fills it (a rank is many threads: unshare(CLONE_NEWUSER) needs one)
    "tmpfs_of_its_own": (
        _LIBC + "import os\nr, w = os.pipe()\nif os.fork() == 0:\n"
        "    libc.prctl(4, 1, 0, 0, 0)   # dumpable again: its own /proc files, to map its user\n"
        "    uid, gid, made = os.getuid(), os.getgid(), libc.unshare(0x10000000 | 0x00020000)\n"
        "    os.write(w, str(0 if made == 0 else ctypes.get_errno()).encode())\n"
        "    if made == 0:\n"
        "        open('/proc/self/setgroups', 'w').write('deny')\n"
        "        open('/proc/self/uid_map', 'w').write(f'0 {{uid}} 1')\n"
        "        open('/proc/self/gid_map', 'w').write(f'0 {{gid}} 1')\n"
        "        os.makedirs('/tmp/a4-own', exist_ok=True)\n"
        "        libc.mount(b'none', b'/tmp/a4-own', b'tmpfs', 0, b'size=8g')\n"
        "        for i in range({hog_mb} // 50):\n"
        "            with open(f'/tmp/a4-own/{{i}}', 'wb') as f:\n"
        "                os.posix_fallocate(f.fileno(), 0, 50 << 20)\n"
        f"        time.sleep({HOLD_S})\n"
        "    os._exit(0)\n"
        "failed = int(os.read(r, 32) or 0)\nif failed:\n    raise OSError(failed, 'unshare')\n"),
    # Sockets the watchdog does not dump: UDP-Lite datagrams nobody reads
    "udplite_queues": (
        "import socket, time\nheld, queued = [], 0\n"
        "while queued < {hog_mb} << 20:\n"
        "    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 136)\n"
        "    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)\n"
        "    receiver.bind(('127.0.0.1', 0))\n"
        "    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 136)\n    held += [receiver, sender]\n"
        "    for _ in range(256):\n        try:\n            queued += sender.sendto(bytes(60000), receiver.getsockname())\n"
        "        except OSError:\n            break\n"),
    "inotify_watches": (   # each watch pins about 0.8 KB of the kernel's, up to max_user_watches
        _LIBC + "import os\nwatcher = libc.inotify_init1(0)\n"
        "if watcher == -1:\n    raise OSError(ctypes.get_errno(), 'inotify_init1')\n"
        "for top in ('/usr/lib', '/usr/share'):\n    for root, dirs, files in os.walk(top):\n"
        "        for name in files + dirs:\n            libc.inotify_add_watch(watcher, os.path.join(root, name).encode(), 2)\n"),
    "record_locks": (   # each locked byte range is about 200 bytes of the kernel's; apart, none merge
        "import fcntl, tempfile\nlocked = tempfile.TemporaryFile()\nfor i in range({hog_mb} * 5000):\n"
        "    fcntl.lockf(locked, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 2 * i)\n"),
    "io_uring_rings": (   # each ring of 32768 entries, its completion queue 131072: about 5 MB
        _LIBC + "held = []\nfor _ in range({hog_mb} // 5):\n    params = (ctypes.c_uint32 * 30)()\n"
        "    params[1], params[2] = 1 << 17, 1 << 4   # cq_entries, flags: IORING_SETUP_CQSIZE\n"
        "    ring = libc.syscall(425, 1 << 15, params)\n" + _FAILED.format(call="ring", name="io_uring_setup") +
        "    held.append(ring)\n"),
}


def memory_attack(name: str, hog_mb: int) -> str:
    """The reference with MEMORY_ATTACKS[name] (or REFUSED_MEMORY[name]) at the start of single_step,
    each rank taking `hog_mb` and holding it HOLD_S seconds."""
    snippet = {**MEMORY_ATTACKS, **REFUSED_MEMORY}[name].format(hog_mb=hog_mb) + f"time.sleep({HOLD_S})\n"
    return inject(REFERENCE.read_text(), snippet)
