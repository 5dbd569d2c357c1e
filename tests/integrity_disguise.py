"""The ways a copier hides a copy, each a function from code to code that keeps what it computes:
rename (every local name and helper), strip (comments and docstrings), reformat (laid out anew
by ast.unparse), reorder (independent lines, methods and functions moved about), split (runs of
statements moved into helper functions). `DISGUISES` names them and their combinations; each
takes the code and a random.Random.

They are the planted set's copies (tests/integrity_planted.py): what the integrity report must
see through, built for the class of disguise, not for one example of it.
"""

import ast
import builtins
import io
import random
import tokenize

API = {"single_step", "single_step_with_grad_accumulation", "data_parallel_single_step",
       "full_column_parallel_single_step", "megatron_mlp_single_step", "mlp_single_step", "init_mlp_weights",
       "run_part", "main", "forward", "backward", "__init__", "seed", "device", "accumulation_steps", "ctx",
       "weight", "world_size", "rank", "w1", "w2", "X", "x", "grad_output", "H_local"}
WORDS = ("tmp", "val", "res", "buf", "arr", "acc", "cur", "nxt", "blk", "part", "piece", "item", "thing", "elt",
         "tns", "mat", "vec", "lhs", "rhs", "aux", "cache", "hold", "keep", "box")


def _defined_names(tree) -> set:
    """Names the code binds inside functions (locals, loop variables, helper parameters) and its
    own helper functions: what a copier renames without breaking what calls the file."""
    names = set()
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        names |= {a.arg for a in fn.args.args + fn.args.kwonlyargs} - API if fn.name not in API else set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
        if fn.col_offset == 0 and fn.name not in API:
            names.add(fn.name)
    return names - API



def rename(code: str, rng: random.Random) -> str:
    """Every local name and helper renamed, consistently, to names of the copier's own; the layout
    is the original's (tokens are replaced in place, comments kept)."""
    tree = ast.parse(code)
    keywords = {k.arg for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg}
    names = sorted(_defined_names(tree) - keywords)   # a keyword argument names the callee's parameter
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | set(names)
    new = {}
    for name in names:
        candidate = f"{rng.choice(WORDS)}_{rng.randrange(100)}"
        while candidate in taken:
            candidate += "x"
        new[name] = candidate
        taken.add(candidate)
    out = []
    toks = list(tokenize.generate_tokens(io.StringIO(code).readline))
    for i, tok in enumerate(toks):
        before = toks[i - 1].string if i else ""
        if tok.type == tokenize.NAME and tok.string in new and before != ".":
            tok = tok._replace(string=new[tok.string])
        elif tok.type == tokenize.STRING and "f" in tok.string.split("'")[0].split('"')[0].lower():
            tok = tok._replace(string=_rename_in_fstring(tok.string, new))   # one token before Python 3.12
        out.append(tok)
    renamed = tokenize.untokenize(out)
    ast.parse(renamed)
    return renamed


def _rename_in_fstring(text: str, new: dict) -> str:
    """`text`, an f-string, with the names inside its braces renamed (`{{` is a brace, not code)."""
    out, depth, i = [], 0, 0
    while i < len(text):
        if text.startswith(("{{", "}}"), i) and depth == 0:
            out.append(text[i:i + 2])
            i += 2
            continue
        depth += text[i] == "{"
        depth -= text[i] == "}" and depth > 0
        if depth and text[i].isidentifier() and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "._")):
            j = i
            while j < len(text) and (text[j].isalnum() or text[j] == "_"):
                j += 1
            out.append(new.get(text[i:j], text[i:j]))
            i = j
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def strip(code: str, rng: random.Random = None) -> str:
    """Comments and docstrings deleted; every other line as it was."""
    tree = ast.parse(code)
    doc_lines = set()
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            for stmt in stmts if isinstance(stmts, list) else []:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                    doc_lines |= set(range(stmt.lineno, stmt.end_lineno + 1))
    comments = {}
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.start[1]
    out = []
    for number, line in enumerate(code.splitlines(), start=1):
        if number in doc_lines:
            continue
        if number in comments:
            line = line[:comments[number]].rstrip()
            if not line.strip():
                continue
        out.append(line)
    text = "\n".join(out) + "\n"
    return _fill_empty_bodies(text)


def _fill_empty_bodies(text: str) -> str:
    """A body left empty (it was only a docstring) gets a `pass`."""
    try:
        ast.parse(text)
        return text
    except SyntaxError:
        pass
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines):
        out.append(line)
        nxt = next((x for x in lines[i + 1:] if x.strip()), "")
        indent = len(line) - len(line.lstrip())
        if line.rstrip().endswith(":") and len(nxt) - len(nxt.lstrip()) <= indent:
            out.append(" " * (indent + 4) + "pass")
    return "\n".join(out) + "\n"


def reformat(code: str, rng: random.Random = None) -> str:
    """Laid out anew by ast.unparse: no comment left, every line broken and spaced its way."""
    return ast.unparse(ast.parse(code)) + "\n"


def _names(node) -> tuple:
    """(names read, names written) by a statement: a call writes the object its method is called on
    and the names it is given (it may change them in place)."""
    reads, writes = set(), set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            (reads if isinstance(n.ctx, ast.Load) else writes).add(n.id)
        if isinstance(n, (ast.Attribute, ast.Subscript)) and not isinstance(n.ctx, ast.Load):
            root = n.value
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            writes.add(root.id if isinstance(root, ast.Name) else "*")   # self.W = ...: self changes
        if isinstance(n, ast.Call):
            for a in ([n.func.value] if isinstance(n.func, ast.Attribute) else []) + list(n.args):
                while isinstance(a, (ast.Attribute, ast.Subscript)):
                    a = a.value
                if isinstance(a, ast.Name):
                    writes.add(a.id)
                elif isinstance(a, ast.Call):
                    writes.add("*")   # a method of what a call returns (super().__init__()): anything
            if isinstance(n.func, ast.Attribute) and n.func.attr in STATEFUL:
                writes.add("*")
    return reads, writes


SIMPLE = (ast.Assign, ast.AugAssign, ast.Expr)
# Methods that change state no name shows (the gradients of every parameter, the random generator).
STATEFUL = {"backward", "step", "zero_grad", "manual_seed", "all_reduce", "all_gather", "broadcast", "barrier"}


def _is_docstring(stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


def _independent(a, b) -> bool:
    """Two simple statements a copier may swap without changing what the code computes: neither
    reads or writes what the other writes (a module a call is made through, `torch` or `dist`,
    counts as written: the random generator, the collectives' order)."""
    if not (isinstance(a, SIMPLE) and isinstance(b, SIMPLE)):
        return False
    ra, wa = _names(a)
    rb, wb = _names(b)
    return "*" not in wa | wb and not (wa & (rb | wb)) and not (wb & ra)


class _Swap(ast.NodeTransformer):
    def __init__(self, rng):
        self.rng = rng

    def _shuffle(self, body: list) -> list:
        body = list(body)
        for i in range(len(body) - 1):
            if self.rng.random() < 0.6 and _independent(body[i], body[i + 1]) and not _is_docstring(body[i]) \
                    and not _is_docstring(body[i + 1]):
                body[i], body[i + 1] = body[i + 1], body[i]
        return body

    def generic_visit(self, node):
        super().generic_visit(node)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.For, ast.While, ast.If, ast.With)):
            node.body = self._shuffle(node.body)
        if isinstance(node, ast.ClassDef):   # methods in another order
            methods = [s for s in node.body if isinstance(s, ast.FunctionDef)]
            self.rng.shuffle(methods)
            it = iter(methods)
            node.body = [next(it) if isinstance(s, ast.FunctionDef) else s for s in node.body]
        return node


def reorder(code: str, rng: random.Random) -> str:
    """Independent lines swapped, methods and module-level functions moved about (a function moves
    only among functions, so everything it needs is still defined before it runs)."""
    tree = _Swap(rng).visit(ast.parse(code))
    body, runs, current = tree.body, [], []
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.FunctionDef) and not stmt.decorator_list:
            current.append(i)
        else:
            runs.append(current)
            current = []
    runs.append(current)
    for run in (r for r in runs if len(r) > 1):
        moved = [body[i] for i in run]
        rng.shuffle(moved)
        for i, stmt in zip(run, moved):
            body[i] = stmt
    return _with_comments_lost(tree)


def _with_comments_lost(tree) -> str:
    return ast.unparse(tree) + "\n"


BLOCKERS = (ast.Return, ast.Yield, ast.YieldFrom, ast.Await, ast.Lambda, ast.NamedExpr, ast.Break, ast.Continue,
            ast.Global, ast.Nonlocal)


def _extractable(stmts: list) -> bool:
    """Statements that can move into a function of their own as they are."""
    return all(isinstance(s, SIMPLE + (ast.For, ast.If, ast.With))
               and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
               and not any(isinstance(n, BLOCKERS) or (isinstance(n, ast.Name) and n.id == "super")
                           for n in ast.walk(s)) for s in stmts)


COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _loads(node) -> set:
    """The names `node` reads from its scope (not a comprehension's own variables)."""
    own = {n.id for c in ast.walk(node) if isinstance(c, COMPREHENSIONS) for g in c.generators
           for n in ast.walk(g.target) if isinstance(n, ast.Name)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - own


def _stores(node) -> set:
    """The names `node` binds in its own scope (a comprehension's variables are its own)."""
    found, stack = set(), [node]
    while stack:
        n = stack.pop()
        if isinstance(n, COMPREHENSIONS):
            continue
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            found.add(n.id)
        stack.extend(ast.iter_child_nodes(n))
    return found


def _needed(stmts: list, defined: set) -> set:
    """The names `stmts` read before they write them (a loop's variable is written before its body
    reads it); `defined` grows with what they write."""
    needed = set()
    for stmt in stmts:
        if isinstance(stmt, ast.For):
            needed |= _loads(stmt.iter) - defined
            defined |= _stores(stmt.target)
            needed |= _needed(stmt.body + stmt.orelse, defined)
        elif isinstance(stmt, (ast.If, ast.While)):
            needed |= (_loads(stmt.test) - defined) | _needed(stmt.body + stmt.orelse, defined)
        elif isinstance(stmt, ast.With):
            for item in stmt.items:
                needed |= _loads(item.context_expr) - defined
                defined |= _stores(item.optional_vars) if item.optional_vars else set()
            needed |= _needed(stmt.body, defined)
        else:
            reads = _loads(stmt) | ({stmt.target.id} if isinstance(stmt, ast.AugAssign)
                                    and isinstance(stmt.target, ast.Name) else set())
            needed |= reads - defined
            defined |= _stores(stmt)
    return needed


def _inputs(run: list, module_names: set) -> list:
    """The names `run` reads before it writes them, that the module does not define: the helper's
    parameters."""
    return sorted(_needed(run, set()) - module_names)


def _split_one(fn, rng, taken: set, module_names: set):
    """A helper made of a run of `fn`'s statements, and `fn` calling it; None when `fn` has no run."""
    runs = [(i, j) for i in range(len(fn.body)) for j in range(i + 2, min(i + 5, len(fn.body)) + 1)
            if _extractable(fn.body[i:j])]
    if not runs:
        return None
    i, j = rng.choice(runs)
    run, after = fn.body[i:j], fn.body[j:]
    written = set().union(*(_stores(s) for s in run))
    used_after = {n.id for s in after for n in ast.walk(s) if isinstance(n, ast.Name)}
    local = {a.arg for a in fn.args.args + fn.args.kwonlyargs} | set().union(*(_stores(s) for s in fn.body))
    params, results = _inputs(run, module_names - local), sorted(written & used_after)   # a local hides a global
    name = f"_{rng.choice(WORDS)}_{rng.randrange(1000)}"
    while name in taken:
        name += "_"
    taken.add(name)
    helper = ast.parse(f"def {name}({', '.join(params)}):\n    pass\n").body[0]
    helper.body = run + ([ast.parse(f"return {', '.join(results)}").body[0]] if results else [])
    call = f"{name}({', '.join(params)})"
    fn.body[i:j] = [ast.parse(f"{', '.join(results)} = {call}" if results else call).body[0]]
    return helper


def split(code: str, rng: random.Random) -> str:
    """Runs of two to four statements of the module's functions (and methods) moved into helper
    functions defined before them, each called where the run was: its inputs as parameters, what
    the rest of the function uses returned."""
    tree = ast.parse(code)
    module_names = {n.id for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.ClassDef))
                    for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    module_names |= {s.name for s in tree.body if isinstance(s, (ast.FunctionDef, ast.ClassDef))}
    module_names |= {(a.asname or a.name).split(".")[0] for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))
                     for a in s.names}
    module_names |= set(dir(builtins))
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | module_names
    body = []
    for stmt in tree.body:
        targets = [stmt] if isinstance(stmt, ast.FunctionDef) else \
            [s for s in stmt.body if isinstance(s, ast.FunctionDef)] if isinstance(stmt, ast.ClassDef) else []
        helpers = []
        for fn in targets:
            if rng.random() < 0.7 and not any(isinstance(d, ast.Name) and d.id == "staticmethod"
                                              for d in fn.decorator_list):
                helper = _split_one(fn, rng, taken, module_names)
                if helper is not None:
                    helpers.append(helper)
        body += helpers + [stmt]
    tree.body = body
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def chain(*steps):
    def disguise(code: str, rng: random.Random) -> str:
        for step in steps:
            code = step(code, rng)
        return code
    disguise.__name__ = "+".join(s.__name__ for s in steps)
    return disguise


# Each disguise alone, and the combinations a copier who means it would use.
DISGUISES = {f.__name__: f for f in (rename, strip, reformat, reorder, split,
                                     chain(rename, strip), chain(strip, rename, reformat), chain(rename, reorder),
                                     chain(split, rename), chain(reorder, split, rename),
                                     chain(strip, rename, reorder, split))}
