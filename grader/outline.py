"""A hand-in's Python where the grader's own processes must read its structure: parsed where a limit holds.

Parsing is the costly part of reading code: `ast.parse` takes up to 0.9 GB of memory per MB of
source (one node every 2 bytes of one-letter lines) and holds the GIL while it does, and Python
3.10's parser overflows its C stack on a long `a+a+...+a` (about 230 KB), killing the process that
parses. So:

- the size of a hand-in's code is held first: grader.intake refuses an assignment4.py above the
  rubric's `files.max_code_kb` or `files.max_code_lines` (grader.limits: CODE_KB, CODE_LINES)
  before anything parses it;
- `spans`, what a hidden check needs of the code (grader.rerun.wire.hidden), is parsed in a child Python
  (`-I -S`: no site, no environment's paths) that caps its own address space (limits.PARSE_MB) and
  CPU time (limits.PARSE_SECONDS) before it reads a byte, under a wall clock of its own; what it
  says is JSON, read field by field. A parse that fails for any reason (code that does not parse,
  a limit, a crash) gives the module's span alone, and the caller shows fewer of the hand-in's
  lines: nothing else changes;
- `tree`, for the integrity report (which needs the tree itself, once for each of hundreds of
  hand-ins held to the caps), parses in this process on a thread with a stack deep enough for any
  code under the caps, so no parser recursion ends the process.
"""

import ast
import json
import subprocess
import sys
import threading

from grader.limits import CODE_KB, PARSE_MB, PARSE_SECONDS

STACK_MB = 64   # the parsing thread's stack: 8 times what Python 3.10 needs at the caps, used as deep as code nests
NAME_CHARS = 100     # a definition's name kept at most this long (grader.rerun.wire.hidden's frames match no longer)
MAX_DEFINITIONS = 20000   # more than 10,000 lines can define

# The child: its limits first, then the source from stdin, then {name: [[first, last], ...]} on stdout.
CHILD = """
import ast, json, resource, sys
for kind, want in ((resource.RLIMIT_AS, int(sys.argv[1]) << 20), (resource.RLIMIT_CPU, int(sys.argv[2]))):
    hard = resource.getrlimit(kind)[1]
    want = want if hard == resource.RLIM_INFINITY else min(want, hard)
    resource.setrlimit(kind, (want, hard))
tree = ast.parse(sys.stdin.buffer.read().decode("utf-8-sig", "replace"))   # a BOM, as Python itself reads a file
found = {}
for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        found.setdefault(node.name, []).append([node.lineno, node.end_lineno or node.lineno])
sys.stdout.write(json.dumps(found))
"""


def _line(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 31


def _read(said: bytes) -> dict:
    """The child's JSON as {name: [(first, last), ...]}, anything else dropped."""
    try:
        data = json.loads(said)
    except ValueError:
        return {}
    found = {}
    for name, pairs in list(data.items())[:MAX_DEFINITIONS] if isinstance(data, dict) else ():
        kept = [(a, b) for a, b in (p for p in pairs if isinstance(p, list) and len(p) == 2)
                if _line(a) and _line(b) and a <= b] if isinstance(pairs, list) else []
        if kept and name != "<module>" and len(name) <= NAME_CHARS:
            found[name] = kept
    return found


def spans(source: str) -> dict:
    """Function or class name -> the (first, last) lines of each definition of it in `source`;
    "<module>" spans the file. Code that does not parse, or not within the child's limits, has no
    spans but the module's."""
    found = {"<module>": [(1, source.count("\n") + 1)]}
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", CHILD, str(PARSE_MB), str(PARSE_SECONDS)],
                              input=source.encode("utf-8", "replace"), capture_output=True,
                              timeout=3 * PARSE_SECONDS, close_fds=True)
    except (OSError, subprocess.SubprocessError):
        return found
    if done.returncode != 0:
        return found
    return found | _read(done.stdout)


def tree(text: str):
    """The syntax tree of `text` (code held to the caps), or None when it does not parse, is larger
    than limits.CODE_KB allows, or is too deep for the parser."""
    if len(text) > CODE_KB * 1024 * 4:   # 4 bytes a character at most: the caps were on bytes
        return None
    parsed = []

    def parse():
        try:
            parsed.append(ast.parse(text[1:] if text.startswith("\ufeff") else text))   # a BOM, as Python reads a file
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            pass

    with _STACK:
        before = threading.stack_size(STACK_MB << 20)
        try:
            worker = threading.Thread(target=parse, name="a4-parse")
            worker.start()
        except RuntimeError:   # no room for its stack (an address-space cap): read by tokens instead
            return None
        finally:
            threading.stack_size(before)
    worker.join()
    return parsed[0] if parsed else None


_STACK = threading.Lock()   # threading.stack_size is the process's: set and reset under a lock
