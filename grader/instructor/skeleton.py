"""Generate the student skeleton from the reference solution.

The reference marks what students write:

    # BEGIN SOLUTION: inputs, targets = ... (1 line)
    inputs, targets = create_batch(...)
    # END SOLUTION

becomes, at the same indentation,

    # TODO: inputs, targets = ... (1 line)
    raise NotImplementedError("TODO in single_step: inputs, targets = ... (1 line)")

and a `# BEGIN REFERENCE ONLY` ... `# END REFERENCE ONLY` block disappears with its markers.
An optional part's lines sit between `# BEGIN PART <id>` and `# END PART <id>` (`<!-- ... -->` in
Markdown): the committed skeleton keeps them (without the markers); a course whose rubric leaves
the part off gets them dropped, markers and all (`strip_parts`), in its release.
Everything else is copied byte for byte, so the skeleton keeps every signature, docstring and
given line of the reference.

    python -m grader skeleton           # rewrite assignment_4/assignment4.py
    python -m grader skeleton --check   # exit 1 if the committed skeleton has drifted
"""

import ast
import re
from pathlib import Path

from grader import kit
from grader.kit import REFERENCE, SKELETON

_BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION:\s*(?P<todo>\S.*?)\s*$")
_END = re.compile(r"^\s*# END SOLUTION\s*$")
_REF_BEGIN = re.compile(r"^\s*# BEGIN REFERENCE ONLY\s*$")
_REF_END = re.compile(r"^\s*# END REFERENCE ONLY\s*$")
_PART = re.compile(r"^\s*(?:#|<!--)\s*(?P<edge>BEGIN|END) PART (?P<part>\w+)\s*(?:-->)?\s*$")
_SCOPE = re.compile(r"^(?P<indent>\s*)(?:async\s+)?(?:def|class)\s+(?P<name>\w+)")


class SkeletonError(ValueError):
    """The reference's markers are malformed (unclosed, nested, or without a TODO text)."""


def strip_parts(text: str, without=(), source_name: str = "text") -> str:
    """`text` without its optional-part markers, and without the lines of the parts in `without`."""
    out, open_part = [], None
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        marker = _PART.match(line)
        if marker is None:
            if open_part is None or open_part not in without:
                out.append(line)
            continue
        if marker["edge"] == "BEGIN":
            if open_part is not None:
                raise SkeletonError(f"{source_name}:{number}: part '{marker['part']}' opens inside part '{open_part}'")
            open_part = marker["part"]
        elif marker["part"] != open_part:
            raise SkeletonError(f"{source_name}:{number}: END PART {marker['part']} closes no open part")
        else:
            open_part = None
    if open_part is not None:
        raise SkeletonError(f"{source_name}: part '{open_part}' is never closed")
    return "".join(out)


def make_skeleton(reference: str, source_name: str = "reference", keep=(), without=()) -> str:
    """Return the skeleton text for the reference text `reference`.

    `keep` names top-level functions or classes whose solutions stay in (their markers are
    dropped): the skeleton with those parts already filled in. `without` names optional parts
    (grader.parts) left out altogether.
    """
    reference = strip_parts(reference, without, source_name)
    keep = set(keep)
    out = []
    scopes = []          # (indent, name) of the enclosing def/class lines
    block = None         # (kind, line number) of the open marker block
    for number, line in enumerate(reference.splitlines(keepends=True), start=1):
        where = f"{source_name}:{number}"
        if block is None:
            scope = _SCOPE.match(line)
            if scope:
                indent = len(scope["indent"])
                scopes = [s for s in scopes if s[0] < indent] + [(indent, scope["name"])]
            begin = _BEGIN.match(line)
            if begin:
                qualname = ".".join(name for _, name in scopes) or "<module>"
                if scopes and scopes[0][1] in keep:
                    block = ("kept", number)
                    continue
                todo = begin["todo"]
                message = f"TODO in {qualname}: {todo}"
                out.append(f"{begin['indent']}# TODO: {todo}\n")
                out.append(f"{begin['indent']}raise NotImplementedError({message!r})\n")
                block = ("solution", number)
            elif _REF_BEGIN.match(line):
                block = ("reference", number)
            elif _END.match(line) or _REF_END.match(line):
                raise SkeletonError(f"{where}: end marker without a begin marker")
            elif "BEGIN SOLUTION" in line:
                raise SkeletonError(f"{where}: write the marker as '# BEGIN SOLUTION: <what to write>'")
            else:
                out.append(line)
        else:
            kind, opened = block
            closes = _REF_END if kind == "reference" else _END
            if closes.match(line):
                block = None
            elif _BEGIN.match(line) or _REF_BEGIN.match(line) or _END.match(line) or _REF_END.match(line):
                raise SkeletonError(f"{where}: marker inside the block opened at line {opened}")
            elif kind == "kept":
                out.append(line)
    if block is not None:
        raise SkeletonError(f"{source_name}:{block[1]}: block is never closed")
    skeleton = "".join(out)
    try:
        ast.parse(skeleton)
    except SyntaxError as e:
        raise SkeletonError(f"the skeleton made from {source_name} does not parse: {e}") from e
    return skeleton


def write_skeleton(reference: Path = REFERENCE, skeleton: Path = SKELETON) -> bool:
    """Regenerate `skeleton` from `reference`; return whether the file changed."""
    text = make_skeleton(reference.read_text(), str(reference.name))
    changed = not skeleton.exists() or skeleton.read_text() != text
    if changed:
        kit.atomic_write(skeleton, text)
    return changed


def skeleton_is_current(reference: Path = REFERENCE, skeleton: Path = SKELETON) -> bool:
    return skeleton.exists() and skeleton.read_text() == make_skeleton(reference.read_text(),
                                                                        str(reference.name))
