"""A part is one module (grader/parts/): the rooms call its record's hooks and never name it.

Adding a part is a recipe (docs/engine.md, "Add a part"); these tests keep it one: no part's id is
written anywhere in the grader's code but in its own module of grader/parts/ (the rubric and the
reference solution name it too, outside the grader's code), and every registered part has every
hook, for every kind of check it runs.
"""

import ast
import re

import pytest

from grader import kit, parts
from grader.parts import BY_ID, KINDS, PARTS, Part
from grader.parts.common import LAYOUTS

GRADER = kit.GRADER


def _docstrings(tree) -> set:
    """The ids of the docstring nodes of a module, its classes and its functions: prose, not code."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def named_parts(source: str) -> set:
    """The part ids the code's string constants name (docstrings aside): a constant that is the id,
    or holds it as a whole word where the id is no English word ("the cold baseline" is prose), and
    not as a file's name ("lab/tensor_parallel.py" names a file of the lab, not the part)."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    words = {}
    for part in PARTS:
        words[part.id] = re.compile(rf"(?<![\w]){re.escape(part.id)}(?![\w]|\.py)")
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            named |= {p for p, word in words.items()
                      if node.value.strip() == p or "_" in p and word.search(node.value)}
    return named


def test_no_room_names_a_part():
    """A room that branched on a part's id would be one more place a new part must be taught."""
    named = {}
    for path in sorted(GRADER.rglob("*.py")):
        rel = path.relative_to(GRADER)
        own = {rel.stem} if rel.parent.as_posix() == "parts" else set()
        found = named_parts(path.read_text()) - own
        if found:
            named[rel.as_posix()] = sorted(found)
    assert not named, f"name the part through its record (grader/parts/), not its id: {named}"


def test_a_named_part_is_found():
    assert named_parts('if part == "megatron_mlp":\n    pass\n') == {"megatron_mlp"}
    assert named_parts('x = {"data_parallel": 1}\nf"{p} tensor_parallel"\n') == {"data_parallel", "tensor_parallel"}
    assert named_parts('"""Part 1, the baseline."""\nlab = "lab/data_parallel.py"\n') == set()
    assert named_parts('said = "the cold baseline"\nkeys = ("baseline",)\n') == {"baseline"}


def test_every_part_is_a_module_of_its_own():
    modules = {p.stem for p in (GRADER / "parts").glob("*.py")} - {"__init__", "common"}
    assert modules == {p.id for p in PARTS}, "a module of grader/parts/ per part, named by its id, each registered"
    for part in PARTS:
        assert getattr(parts, part.id).PART is part


@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.id)
def test_every_part_has_every_hook(part: Part):
    assert part.kinds and set(part.kinds) <= set(KINDS)
    for kind in part.kinds:
        assert part.layouts[kind] in LAYOUTS
        assert callable(part.runs[kind])
        module, _, name = part.judging[kind].partition(":")
        assert module.startswith("grader.verdict.") and name, part.judging[kind]
        check = {"input_dim": 8, "output_dim": 4, "hidden_dim": 16, "global_batch_size": 6, "kind": kind}
        assert part.room(check, kind) >= 8 * 4
        assert "values" not in part.should(check, kind, True) and part.should(check, kind, False)
        assert part.kind_said(kind)
    assert {m.kind for m in part.moves} <= set(part.kinds)
    for hook in ("factors", "mistakes", "run_mistake"):
        assert callable(getattr(part, hook))
    assert set(part.arguments) | set(part.own_sizes) <= set(kit_check_keys())
    assert part.handout_log in ("", parts.CHANGED, parts.MATCHES)
    assert all((kit.ROOT / path).is_file() for path in part.lab)
    assert part.layer or part.kinds == ("step",), "a part run alone at a check names the class it runs"


def kit_check_keys() -> set:
    from dataclasses import fields

    from grader.rubric import Check
    return {f.name for f in fields(Check)}


def test_every_judging_resolves_in_the_verdict():
    from grader.verdict.judging import Judging, judging
    for part in PARTS:
        for kind in part.kinds:
            assert isinstance(judging(part.id, kind), Judging)


def test_the_registry_keeps_the_handouts_order():
    assert [parts.number(p.id) for p in PARTS] == list(range(1, len(PARTS) + 1))
    assert BY_ID == {p.id: p for p in PARTS}
    assert parts.CORE_PART_IDS + parts.OPTIONAL_PART_IDS == parts.PART_IDS   # the optional parts come last


def test_the_course_copys_every_part_rubric_turns_on_every_optional_part_and_is_accepted():
    """tests.corpus.with_every_part is what `make test-course` grades with every optional part on: a
    part added later must be in it, and the rubric it makes must pass every rule of the rubric."""
    import yaml

    from grader.rubric import rubric_from_dict
    from tests.corpus import with_every_part
    data = with_every_part(yaml.safe_load((kit.GRADER / "rubric.yaml").read_text()))
    rubric = rubric_from_dict(data, "with_every_part")
    assert set(rubric.part_ids) == {p.id for p in PARTS}
