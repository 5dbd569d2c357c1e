"""How a rank loads the hand-in's code: from source only, without the script's own statements.

Hand-ins written to the handout word for word must run unchanged: top-level script code
(initialising, calling the parts, printing) is not executed; imports, definitions and plain
assignments are (`script_statements_removed`). Every module comes from its source alone
(`compile_source`, `compile_assignment`): no bytecode cache is read, so none a hand-in planted can load.
"""

import ast
import base64
import marshal
import sys
import types

from grader.parts import BY_ID

PART_FUNCTIONS = {part.function for part in BY_ID.values()}   # what a part runs: never at load


def _called(node, by_name_only: bool = False) -> set:
    """The names `node` calls: f(...) and anything.f(...) (`by_name_only`: f(...) alone)."""
    kinds = ast.Name if by_name_only else (ast.Name, ast.Attribute)
    return {c.func.id if isinstance(c.func, ast.Name) else c.func.attr
            for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, kinds)}


def _reaching(own: dict, names: set) -> set:
    """The module's own functions and classes (`own`: name -> definition) that call one of `names`,
    themselves or through others of its own."""
    calls = {name: _called(node) for name, node in own.items()}
    reached = {name for name, called in calls.items() if called & names}
    while True:
        more = {name for name, called in calls.items() if name not in reached and called & reached}
        if not more:
            return reached
        reached |= more


def script_statements_removed(tree: ast.Module) -> list:
    """Drop the top-level statements that would run the script; return the line numbers dropped.

    Kept: imports, function and class definitions, the docstring, and assignments that call no
    function of the module itself (so `rank, local_rank, world_size = init_distributed()` from utils
    and `local_batch_size = global_batch_size // world_size` stay; `w = single_step()` goes), or
    only functions of its own that set up the process group (they call `init_process_group`) and run
    no part: the handout's `init_distributed`, written into assignment4.py, runs as it would from
    utils.py (the world's group is already up: grader.rerun.rank.hooks.keep_the_world).
    """
    own = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    setting_up = _reaching(own, {"init_process_group"}) - _reaching(own, PART_FUNCTIONS)
    kept, dropped = [], []
    for i, node in enumerate(tree.body):
        keep = isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                 ast.AsyncFunctionDef, ast.ClassDef))
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            keep = _called(node, by_name_only=True) & set(own) <= setting_up
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            keep = True
        if isinstance(node, ast.Try):
            inner = node.body + [s for h in node.handlers for s in h.body]
            keep = all(isinstance(s, (ast.Import, ast.ImportFrom, ast.Pass, ast.Assign)) for s in inner)
        (kept if keep else dropped).append(node)
    tree.body = kept
    return [node.lineno for node in dropped]


def compile_assignment(path: str) -> tuple:
    """The hand-in's assignment4.py compiled without its script statements: (code, lines skipped)."""
    with open(path, "rb") as f:
        source = f.read()
    tree = ast.parse(source, filename=path)
    skipped = script_statements_removed(tree)
    return compile(tree, path, "exec"), skipped


def compiled_blob(code, skipped: list, utils) -> str:
    """What `compile_assignment` gave, with the trusted utils.py compiled (`utils`, compile_source's),
    as text a later world of the same files is sent (WorldJob's `compiled`): parsing and compiling
    the reference costs its leader about 50 ms, utils.py 2 ms to 3 ms, loading both from this under
    2 ms. The grader only keeps the text and sends it back; a leader alone reads it."""
    return base64.b64encode(marshal.dumps((code, list(skipped), utils))).decode("ascii")


def from_blob(blob: str, path: str, utils_path: str) -> tuple:
    """(code, lines skipped, utils code) of `compiled_blob`'s text, the code's file names made
    `path` and `utils_path` (this world's copies, which tracebacks name); ValueError if the text is
    not such a triple."""
    try:
        code, skipped, utils = marshal.loads(base64.b64decode(blob, validate=True))
        if not isinstance(code, types.CodeType) or not isinstance(utils, types.CodeType) or \
                not all(isinstance(n, int) for n in skipped):
            raise ValueError("another object")
    except (TypeError, ValueError, EOFError) as e:   # binascii.Error is a ValueError
        raise ValueError(f"not compiled code: {e}") from None
    return _relocated(code, path), list(skipped), _relocated(utils, utils_path)


def _relocated(code: types.CodeType, path: str) -> types.CodeType:
    """`code` and every code object inside it (functions, classes, comprehensions) as if compiled from `path`.
    Code compiled from `path` already (every world's folder is /tmp/world in the sandbox) is kept as it is:
    what one compile makes carries one file name throughout."""
    if code.co_filename == path:
        return code
    consts = tuple(_relocated(c, path) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=path, co_consts=consts)


def run_module(name: str, code, path: str):
    """Execute `code` (compiled from the file at `path`) as the module `name`; return the module."""
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    exec(code, module.__dict__)
    return module


def compile_source(path: str):
    """The file at `path` compiled from its source alone: no bytecode cache is read (one a hand-in
    planted beside it, say) or written."""
    with open(path, "rb") as f:
        return compile(f.read(), path, "exec", dont_inherit=True)
