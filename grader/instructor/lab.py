"""What of the lecture's lab (lab/) a students' release holds: not the files that answer the assignment.

The lab shows in working code what several of the assignment's TODOs ask for (ANSWERS, gathered
from each part's record, grader.parts: `lab`):

    lab/data_parallel.py      Part 3: the all-reduce of every gradient, then the division by n
    lab/tensor_parallel.py    Part 4: f and the gather around a column-parallel layer;
                              Part 5: g as an autograd Function, and the columns-then-rows pair
    lab/pipeline_parallel.py  Part 2: each micro-batch's loss divided by the number of them
    lab/mappings.py, vocab_parallel.py, gpt_parallel.py, transformer.py
                              Parts 4 and 5: f and g as autograd Functions, around the transformer's
                              heads, MLP and vocabulary (transformer.py runs the others)

A students' release leaves out every file that answers a part the course grades, and the part of
lab/README.md about them (between `<!-- BEGIN LAB ANSWERS -->` and `<!-- END LAB ANSWERS -->`);
lab/run_all.py runs the parts a copy of the lab holds. `python -m grader release --lab-answers`
ships the lab whole, for a course that hands the lab out in class or after the deadline; the
release names the files and the TODOs they answer either way. `answer_traces` finds an answer in
a lab file the map does not name (one added later): an all-reduce of a `.grad`, or an autograd
Function whose forward or backward reaches a collective.
"""

import ast
import re

from grader.parts import BY_ID, PARTS

# lab file -> {part: what of that part's TODOs it shows}, from each part's record (`lab`)
ANSWERS = {path: {p.id: p.lab[path] for p in PARTS if path in p.lab}
           for path in dict.fromkeys(path for p in PARTS for path in p.lab)}
BEGIN, END = "<!-- BEGIN LAB ANSWERS -->", "<!-- END LAB ANSWERS -->"
ANSWERS_BLOCK = re.compile(rf"^{re.escape(BEGIN)}\n.*?^{re.escape(END)}\n", re.S | re.M)
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
               "reduce_scatter_tensor", "reduce_scatter_single", "reduce", "all_to_all", "broadcast"}


def answered(parts) -> dict:
    """{lab file: what it answers} for the files that answer a TODO of `parts` (a rubric's)."""
    found = {}
    for path, answers in ANSWERS.items():
        said = [f"{BY_ID[p].title.split(':')[0]}'s TODOs: {what}" for p, what in answers.items() if p in parts]
        if said:
            found[path] = "; ".join(said)
    return found


def without_answers(readme: str) -> str:
    """lab/README.md without its part about the files that answer the assignment."""
    return ANSWERS_BLOCK.sub("", readme)


def without_markers(readme: str) -> str:
    return "".join(line for line in readme.splitlines(keepends=True) if line.strip() not in (BEGIN, END))


def _called(node) -> set:
    """The names `node` calls: `f(...)` and `x.f(...)` both call f."""
    return {c.func.attr if isinstance(c.func, ast.Attribute) else c.func.id for c in ast.walk(node)
            if isinstance(c, ast.Call) and isinstance(c.func, (ast.Attribute, ast.Name))}


def answer_traces(text: str) -> list:
    """Where `text` (Python) holds an answer of the assignment: ["line N: what"]."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    reaching = set(COLLECTIVES)   # functions of the file that call a collective, and the collectives
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    for _ in functions:
        reaching |= {f.name for f in functions if _called(f) & reaching}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) and node.args and \
                (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "all_reduce" and \
                isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "grad":
            found.append(f"line {node.lineno}: all-reduces a gradient (Part 3's TODO)")
        if isinstance(node, ast.ClassDef) and any((b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", ""))
                                                  == "Function" for b in node.bases):
            methods = [m for m in node.body if isinstance(m, ast.FunctionDef) and m.name in ("forward", "backward")]
            if any(_called(m) & reaching for m in methods):
                found.append(f"line {node.lineno}: an autograd Function that calls a collective, as f and g are "
                             f"(Parts 4 and 5's TODOs)")
    return found
