"""How a rank loads the hand-in's code: from source only, without the script's own statements.

Hand-ins written to the handout word for word must run unchanged: top-level script code
(calling the parts, printing) is not executed; imports, definitions, assignments that run no part
and the `if` and `try` blocks that hold them are (`script_statements_removed`). Every module comes from its source alone
(`compile_source`, `compile_assignment`): no bytecode cache is read, so none a hand-in planted can load.
"""

import ast
import base64
import marshal
import sys
import types

from grader.parts import BY_ID

PART_FUNCTIONS = {part.function for part in BY_ID.values()}   # what a part runs: never at load


def _called(node) -> set:
    """The names `node` calls: f(...) and anything.f(...)."""
    return {c.func.id if isinstance(c.func, ast.Name) else c.func.attr
            for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, (ast.Name, ast.Attribute))}


def _reaching(uses: dict, names: set) -> set:
    """The names of `uses` (name -> the names its code uses: the module's own functions, classes and
    methods, `_own_uses`) that use one of `names`, themselves or through others of its own."""
    reached = {name for name, used in uses.items() if used & names}
    while True:
        more = {name for name, used in uses.items() if name not in reached and used & reached}
        if not more:
            return reached
        reached |= more


CONSTRUCTING = ("__init__", "__new__", "__post_init__", "__call__")   # what making (or calling) an instance runs


def _used(node) -> set:
    """Every name `node` reads, and every attribute: what it calls, and what it hands on to be called
    (mp.spawn(worker), a thread's target)."""
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


def _own_uses(tree: ast.Module) -> dict:
    """name -> what it uses (`_used`), for the module's own functions, its classes (what making an
    instance runs: the class body but its methods, and CONSTRUCTING) and their methods, by name."""
    uses = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            uses[node.name] = _used(node)
        elif isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            for method in methods:
                uses[method.name] = uses.get(method.name, set()) | _used(method)
            made = [n for n in node.body if n not in methods or n.name in CONSTRUCTING]
            uses[node.name] = set().union(*(_used(n) for n in made)) | set(CONSTRUCTING)
    return uses


DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
SCRIPT_CALLS = {"print", "pprint", "exit", "quit", "_exit", "abort"}   # a statement of these is the script's


def _callee(call: ast.Call) -> str:
    """f of f(...) or anything.f(...)."""
    return call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")


def _runs_the_script(test: ast.expr) -> bool:
    """Whether an `if`'s test is the script's guard (`__name__ == "__main__"`, however written)."""
    return any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(test))


def _names(node, context) -> set:
    """The names `node` reads (ast.Load) or binds (ast.Store)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, context)}


class _Script:
    """What a module's top level keeps (see script_statements_removed): `running`, the names that
    run a part; `tainted`, the names a statement left out binds (what reads them is left out too:
    a part's result, compared or broadcast after it ran); `dropped`, the lines left out."""

    def __init__(self, running: set):
        self.running, self.tainted, self.dropped = running, set(), []
        self.binding = {}   # name -> the first line where a statement left out binds it

    def filtered(self, body: list, first: bool = False) -> list:
        kept = []
        for i, node in enumerate(body):
            docstring = first and i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            if docstring or isinstance(node, DEFINITIONS) or self._keeps(node):
                kept.append(node)
            else:
                self.dropped.append(node.lineno)
                self.tainted |= _names(node, ast.Store)
                for n in ast.walk(node):
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                        self.binding.setdefault(n.id, n.lineno)
        return kept

    def _keeps(self, node) -> bool:
        """Whether `node` stays (an `if`'s or a `try`'s statements filtered in place)."""
        if _names(node.test if isinstance(node, ast.If) else node, ast.Load) & self.tainted and \
                not isinstance(node, ast.Try):
            return False
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            return not _called(node) & self.running
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return not _called(node) & self.running and _callee(node.value) not in SCRIPT_CALLS
        if isinstance(node, ast.If) and not _runs_the_script(node.test) and not _called(node.test) & self.running:
            lines = len(self.dropped)
            node.body, node.orelse = self.filtered(node.body), self.filtered(node.orelse)
            if not (node.body or node.orelse):
                del self.dropped[lines:]   # the whole `if` is said left out, by its own line
                return False
            node.body = node.body or [ast.copy_location(ast.Pass(), node)]
            return True
        if isinstance(node, ast.Try):
            lines = len(self.dropped)
            node.body, node.orelse = self.filtered(node.body), self.filtered(node.orelse)
            node.finalbody = self.filtered(node.finalbody)
            for handler in node.handlers:
                handler.body = self.filtered(handler.body) or [ast.copy_location(ast.Pass(), handler)]
            if not node.body:
                del self.dropped[lines:]
                return False
            return True
        return False


def script_statements_removed(tree: ast.Module) -> list:
    """Drop the top-level statements that would run the script; return the line numbers dropped.

    Kept: imports, function and class definitions, the docstring; assignments and calls that run no
    part (they call no part function, nor a function, class or method of the module's own that
    does, by name or as an attribute), but a print or an exit: `rank, local_rank, world_size =
    init_distributed()`, the same through a wrapper of the module's own (the world's group is
    already up: grader.rerun.rank.hooks.keep_the_world), `cfg = TrainConfig()`,
    `parser.add_argument(...)` and `args = parser.parse_args()` stay, `w = single_step()`,
    `main()` and `print(w)` go; and an `if` (but the script's `__name__` guard) or a `try` with what
    it holds filtered alike: `if torch.cuda.is_available(): DEVICE = ...` stays. Dropped: every
    other statement (loops, `with` blocks, the guard), and every one that reads a name a statement
    dropped binds (`compare_tensors(w, expected)` and `dist.broadcast(w, src=0)` after `w =
    single_step()`, as the handout's script has them).
    """
    return sorted(_filter(tree).dropped)


def _filter(tree: ast.Module) -> _Script:
    """Leave out `tree`'s script statements (script_statements_removed); what was left out."""
    script = _Script(PART_FUNCTIONS | _reaching(_own_uses(tree), PART_FUNCTIONS))
    tree.body = script.filtered(tree.body, first=True)
    return script


def left_out_binding(path: str, name: str) -> int:
    """The line of the file at `path` where a top-level statement left out (script_statements_removed)
    binds `name`, or 0 where none does: what a NameError of a part that reads what the script's own
    run binds (`W = single_step()` at the top level, read inside another part) points to. Read
    again only when such an error happens, in the rank that raised it."""
    try:
        with open(path, "rb") as f:
            return _filter(ast.parse(f.read(), filename=path)).binding.get(name, 0)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return 0


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
