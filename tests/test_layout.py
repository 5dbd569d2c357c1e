"""The grader's rooms and their import rules (the map at the top of grader/__init__.py)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grader import kit

GRADER = kit.GRADER
SHARED_MODULES = {Path(name).stem for name in kit.SHARED} - {"__init__", "__main__", "cli"}
# room -> the rooms (besides the shared modules and itself) it may import
HANDIN = {"rerun", "evidence", "intake", "verdict", "pipeline"}   # one hand-in's grading (kit.HANDIN_ROOMS)
MAY_IMPORT = {
    "rerun": set(),
    "evidence": set(),                      # the logs, read as bytes
    "intake": {"evidence"},                 # a hand-in's runs are found by what they hold
    "verdict": {"rerun", "evidence"},
    "pipeline": HANDIN - {"pipeline"},
    "batch": HANDIN | {"analytics"},
    "grades": {"analytics"},   # final grades read results and files only: no engine, no pipeline, no torch
    "student": HANDIN,
    "gradescope": HANDIN,
    "instructor": set(),
    "integrity": {"intake", "evidence", "analytics"},   # unpacks hand-ins and reads logs; runs no code
    "analytics": set(),   # the batch report reads results only, like grades
}
# Rooms that never import torch: a TA's machine without it still unpacks, reads logs, compares
# hand-ins and computes final grades (tests/pythons runs them on every Python without torch).
TORCH_FREE = {"shared", "cli", "package", "main", "instructor", "evidence", "intake", "integrity", "grades",
              "analytics"}


def modules() -> dict:
    """Dotted module name -> its file, for every module of the grader."""
    found = {}
    for path in sorted(GRADER.rglob("*.py")):
        parts = list(path.relative_to(GRADER.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(path: Path, top_level_only: bool = False) -> set:
    """The grader modules (and third-party tops) `path` imports; inside functions too unless
    `top_level_only`."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            if node.module.startswith("grader"):
                # `from grader.rerun.wire import channel` imports grader.rerun.wire.channel
                names |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules()}
    return names


def room_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    if parts[1] in MAY_IMPORT:
        return parts[1]
    return {"cli": "cli", "__main__": "main"}.get(parts[1], "shared")


def test_the_rules_know_every_room():
    assert set(MAY_IMPORT) == set(kit.ROOMS)
    assert HANDIN == set(kit.HANDIN_ROOMS) and set(kit.HANDIN_ROOMS) <= set(kit.GRADING_ROOMS)


def test_every_module_is_in_a_known_room():
    for module in modules():
        room = room_of(module)
        if room == "shared":
            assert module.split(".")[1] in SHARED_MODULES, f"{module}: not a shared module of grader.kit.SHARED"


def room_map(doc: str) -> dict:
    """The map at the top of grader/__init__.py: room ("shared", "rerun", ...) -> its entry's text.
    An entry opens with the room's name at an indent of 4 and runs on at a deeper indent."""
    rooms, room = {}, None
    for line in doc.split("Import rules")[0].splitlines():
        opened = re.match(r"    (\w+)/?  +(.*)", line)
        if opened:
            room = opened.group(1)
            rooms[room] = opened.group(2)
        elif room and line.startswith("     "):
            rooms[room] += " " + line.strip()
        else:
            room = None
    return rooms


def unmapped(doc: str) -> list:
    """The rooms and modules of the grader that the map in `doc` does not name (a module by its
    name as a word of its room's entry)."""
    rooms = room_map(doc)
    missing = [f"room {room}" for room in ("shared", *kit.ROOMS) if room not in rooms]
    for module in modules():
        parts = module.split(".")   # grader, grader.kit, grader.rerun (its __init__), grader.rerun.rank.hooks
        if len(parts) == 2 and parts[1] in kit.ROOMS or len(parts) == 1:
            continue
        room = parts[1] if len(parts) >= 3 else "shared"   # a room's sub-package (grades.lms) is the room's
        if not re.search(rf"(?<![\w.]){re.escape(parts[-1])}(?!\w)", rooms.get(room, "")):
            missing.append(module)
    return missing


def test_the_map_names_every_room_and_module():
    import grader
    assert not unmapped(grader.__doc__), f"name these in the map of grader/__init__.py: {unmapped(grader.__doc__)}"


def test_a_module_left_off_the_map_is_found():
    import grader
    assert unmapped(grader.__doc__.replace("hooks", "wrappers")) == ["grader.rerun.rank.hooks"]
    assert unmapped(grader.__doc__.replace(" typed (", " types (")) == ["grader.typed"]
    assert "room analytics" in unmapped(grader.__doc__.replace("    analytics/", "    numbers/"))


@pytest.mark.parametrize("module", sorted(modules()))
def test_imports_follow_the_rules(module):
    path = modules()[module]
    room = room_of(module)
    top_level = imports(path, top_level_only=True)
    for name in imports(path):
        if not name.startswith("grader"):
            # A part's hooks run in a rank or in the verdict, where torch is loaded: each imports it
            # when called, never at the top (grader/parts/__init__.py).
            lazy = module.startswith("grader.parts.") and name not in top_level
            if room in TORCH_FREE and not lazy:
                assert name.split(".")[0] != "torch", f"{module} imports torch"
            continue
        target = room_of(name)
        assert target != "cli" or room == "main", f"{module} imports the command line"
        if room in ("shared", "package"):
            assert target in ("shared", "package"), f"shared {module} imports the room {name}"
        elif room in MAY_IMPORT:
            allowed = {"shared", "package", room} | MAY_IMPORT[room]
            assert target in allowed, f"{module} ({room}) imports {name} ({target})"
    if room == "cli":
        rooms = {room_of(n) for n in imports(path, top_level_only=True) if n.startswith("grader")}
        assert rooms <= {"shared", "package"}, f"the command line imports {rooms} before a command runs"


# A room's wings (sub-packages) -> the other wings each may import. The room's own modules may
# import every wing; no wing imports them (grader/__init__.py: the engine's wings).
WINGS = {"rerun": {"wire": set(), "sandbox": set(), "rank": {"wire", "sandbox"}}}
ROOM_LINES = 2500   # a room, or a wing of one, that a reader can hold in mind


def wing_of(module: str) -> str:
    """The wing of `module` ("" for a room's own modules, or a module outside any winged room)."""
    parts = module.split(".")
    return parts[2] if len(parts) >= 3 and parts[2] in WINGS.get(parts[1], {}) else ""


@pytest.mark.parametrize("module", sorted(m for m in modules() if wing_of(m)))
def test_wings_import_only_the_wings_they_may(module):
    room, wing = module.split(".")[1], wing_of(module)
    for name in imports(modules()[module]):
        if name.startswith(f"grader.{room}.") and name in modules():
            target = wing_of(name)
            assert target, f"{module} (wing {wing}) imports the room's own {name}"
            assert target in {wing} | WINGS[room][wing], f"{module} (wing {wing}) imports {name} (wing {target})"


def test_no_room_or_wing_is_too_long_to_hold_in_mind():
    lines = {}
    for module, path in modules().items():
        parts = module.split(".")
        if len(parts) > 2 and parts[1] in kit.ROOMS:
            key = parts[1] + ("/" + wing_of(module) if wing_of(module) else "")
            lines[key] = lines.get(key, 0) + len(path.read_text().splitlines())
    assert {"rerun/sandbox", "rerun/wire", "rerun/rank"} <= set(lines), lines
    assert not {k: n for k, n in lines.items() if n > ROOM_LINES}, f"split into wings: {lines}"


def test_no_module_imports_one_that_imports_it():
    # Imports inside functions too: a lazy import that closes a loop is still a loop in the design.
    graph = {m: {n for n in imports(p) if n in modules()} for m, p in modules().items()}
    state = {}

    def visit(module, trail):
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", "import cycle: " + " -> ".join(trail + [module])
        state[module] = "open"
        for target in graph[module]:
            if target != module and not module.startswith(target + "."):   # a package's own modules
                visit(target, trail + [module])
        state[module] = "done"

    for module in graph:
        visit(module, [])


def test_slurm_and_lab_import_only_the_shared_modules_and_nothing_imports_them():
    """slurm/ and lab/ ship beside the grader (the release, the installed kit) and use its shared
    vocabulary (typed, plots), never a room; the grader never reaches back into them."""
    for path in sorted([*(GRADER.parent / "slurm").rglob("*.py"), *(GRADER.parent / "lab").rglob("*.py")]):
        for name in imports(path):
            if name.startswith("grader."):
                assert room_of(name) in ("shared", "package"), f"{path.relative_to(GRADER.parent)} imports {name}"
    for module, path in modules().items():
        reached = {name.split(".")[0] for name in imports(path)}
        assert not reached & {"slurm", "lab"}, f"{module} imports {reached & {'slurm', 'lab'}}"


def test_modules_stay_readable_in_one_sitting():
    long = {m: len(p.read_text().splitlines()) for m, p in modules().items()
            if len(p.read_text().splitlines()) > 320}
    assert not long, f"split these by what they do: {long}"


FUNCTION_LINES = 60   # a function is read at a glance, as a module is in one sitting
OUR_PYTHON = ("grader", "slurm", "lab", "benchmarks", "assignment_4/reference", "tests")


def long_functions(paths, root: Path = GRADER.parent) -> list:
    """"file:function (lines)" for every function or method of `paths` (below `root`) over
    FUNCTION_LINES lines."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    found.append(f"{path.relative_to(root)}:{node.name} ({lines})")
    return found


def test_no_function_is_over_sixty_lines():
    paths = [p for top in OUR_PYTHON for p in sorted((GRADER.parent / top).rglob("*.py"))
             if "data" not in p.relative_to(GRADER.parent).parts]
    assert not long_functions(paths), f"split these by what they do: {long_functions(paths)}"


def test_a_long_function_is_found(tmp_path):
    (tmp_path / "long.py").write_text("def f():\n" + "    x = 1\n" * FUNCTION_LINES)
    (tmp_path / "short.py").write_text("def g():\n" + "    x = 1\n" * (FUNCTION_LINES - 1))
    assert [f.split(":")[1] for f in long_functions([tmp_path / "long.py", tmp_path / "short.py"], tmp_path)] == ["f (61)"]


def test_a_module_named_after_a_command_lives_in_that_commands_room():
    """`grader/batch/gradebook.py` beside the `gradebook` command of grader/grades/ sent readers to
    the wrong room: a module may take a command's name only in the room that runs the command.
    `grade` and `check` are the verbs of the whole engine (one hand-in's grade, a re-run's check)."""
    from grader.cli import COMMANDS
    named = {name.replace("-", "_"): room for name, (room, *_) in COMMANDS.items() if name not in ("grade", "check")}
    wrong = [m for m in modules() if len(m.split(".")) == 3 and named.get(m.split(".")[2], m.split(".")[1]) != m.split(".")[1]]
    assert not wrong, f"rename these for what they do: {wrong}"


def test_the_command_line_loads_no_torch_and_no_room():
    code = ("import sys\nfrom grader import cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "try:\n    cli.main(['skeleton', '--check'])\nexcept SystemExit:\n    pass\n"
            "rooms = sorted(m for m in sys.modules if m.startswith('grader.') and m.count('.') > 1\n"
            "               and not m.startswith('grader.parts.'))\n"   # the parts are shared, not a room
            "print('torch' in sys.modules, rooms)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=kit.ROOT)
    assert proc.returncode == 0, proc.stderr
    torch_loaded, rooms = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    assert torch_loaded == "False"
    # skeleton --check ran (the skeleton and the handout's points): its room, and only its room, was loaded
    assert rooms == "['grader.instructor.commands', 'grader.instructor.handout', 'grader.instructor.skeleton']", rooms


def test_the_sandbox_stages_what_the_zygote_imports_and_no_more():
    from grader.rerun.bwrap import ENGINE
    found, todo = set(), ["grader.rerun.zygote"]
    while todo:
        module = todo.pop()
        if module in found or module not in modules():
            continue
        found.add(module)
        for name in imports(modules()[module]):
            parts = name.split(".")
            todo += [".".join(parts[:i]) for i in range(1, len(parts) + 1) if parts[0] == "grader"]
    staged = {str(modules()[m].relative_to(GRADER)) for m in found}
    engine = {str(p.relative_to(GRADER)) for pattern in ENGINE for p in GRADER.glob(pattern)}   # parts/*.py: each part
    assert engine == staged, f"stage {sorted(staged - engine)}, not {sorted(engine - staged)}"


def test_no_module_writes_its_own_plain():
    """Dataclasses become JSON-ready through grader.typed.plain alone."""
    for module, path in modules().items():
        defined = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
        assert "_plain" not in defined, f"{module} defines _plain: use grader.typed.plain"


def defined_names(path: Path) -> set:
    """The names `path` defines or imports at its top level."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def stale_names(text: str) -> list:
    """The paths (grader/x/y.py) and dotted names (grader.x.y.name) in `text` that name nothing:
    a dotted name's longest module prefix must be a module and its next part a module or a name
    that module defines."""
    found = modules()
    stale = [p for p in re.findall(r"(?<![\w/.])grader/[\w/]+\.(?:py|yaml)\b", text) if not (GRADER.parent / p).exists()]
    for name in re.findall(r"(?<![\w.])grader(?:\.[A-Za-z_]\w*)+", text):
        parts = name.split(".")
        known = max(k for k in range(1, len(parts) + 1) if ".".join(parts[:k]) in found)
        if known < len(parts) and parts[known] not in defined_names(found[".".join(parts[:known])]):
            stale.append(name)
    return stale


def test_every_module_path_the_grader_names_exists():
    for path in [*modules().values(), *GRADER.glob("*.yaml")]:
        assert not stale_names(path.read_text()), f"{path.relative_to(GRADER.parent)} names {stale_names(path.read_text())}"


def test_a_stale_name_is_found():
    assert stale_names("goes through `grader.grade.grade_handin` (a grader.handin.Handin)") == \
        ["grader.grade.grade_handin", "grader.handin.Handin"]
    assert stale_names("enforced by the sandbox (grader/sandbox.py), see grader.rerun.nowhere") == \
        ["grader/sandbox.py", "grader.rerun.nowhere"]
    assert stale_names("grader.pipeline.grade.grade_handin, grader/rerun/sandbox/namespaces.py, grader.rerun.wire.protocol") == []


# A hand-in's files: the pipeline alone writes them (grader.pipeline.record); the routes collect statuses.
HANDIN_FILES = ("grading.json", "results.json", "feedback.md", "feedback.html")
FILE_TEXT = {"grader.pipeline.report", "grader.pipeline.feedback"}   # what makes those files' text
WRITERS = {"atomic_write", "atomic_path", "write_json", "write_text", "write_bytes", "copy", "copy2", "copyfile",
           "copyfileobj", "rename", "replace", "link", "symlink_to", "move"}


def _writes_a_handin_file(call: ast.Call) -> bool:
    """Whether `call` writes to a path it names by one of HANDIN_FILES (open() only with a mode that writes)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name == "open":
        modes = [a for a in call.args[1:2] + [k.value for k in call.keywords if k.arg == "mode"]
                 if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not any(set(m.value) & set("wax+") for m in modes):
            return False
    elif name not in WRITERS:
        return False
    named = [n.value for a in [*call.args, *(k.value for k in call.keywords)] for n in ast.walk(a)
             if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return any(text.endswith(HANDIN_FILES) for text in named)


def handin_file_writes(path: Path) -> list:
    """Where `path` writes a hand-in's file itself, or imports what makes one's text: "line N: why"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and _writes_a_handin_file(node):
            found.append(f"line {node.lineno}: writes {ast.unparse(node)[:80]}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = {a.name for a in node.names} if isinstance(node, ast.Import) else \
                {node.module or ""} | {f"{node.module}.{a.name}" for a in node.names}
            found += [f"line {node.lineno}: imports {n}" for n in sorted(names & FILE_TEXT)]
    return found


def test_only_the_pipeline_writes_a_handins_files():
    """grading.json, results.json, feedback.md and feedback.html are written by grader.pipeline.record
    alone: the batch, an array task, Gradescope and the benchmarks call it and collect a status; none
    writes those names or imports what renders them (grades.csv's view is read back from disk)."""
    beside = [p for d in ("slurm", "lab", "benchmarks") for p in sorted((GRADER.parent / d).rglob("*.py"))]
    elsewhere = [p for m, p in modules().items() if room_of(m) != "pipeline"] + beside
    wrong = {str(p.relative_to(GRADER.parent)): handin_file_writes(p) for p in elsewhere if handin_file_writes(p)}
    assert not wrong, f"have grader.pipeline.record write these: {wrong}"


def test_a_handin_file_written_outside_the_pipeline_is_found(tmp_path):
    code = tmp_path / "writer.py"
    code.write_text("from grader.pipeline.report import gradescope_results\nfrom grader.pipeline import feedback\n"
                    "write_json(folder / 'results.json', doc)\nopen(out / 'feedback.md', 'w')\n"
                    "open(out / 'grading.json')\n(folder / 'grading.json').stat()\natomic_write(out / 'grades.csv', text)\n")
    assert [w.split(":")[0] for w in handin_file_writes(code)] == ["line 1", "line 2", "line 3", "line 4"]


def test_the_gradebook_view_is_built_in_one_place_from_disk():
    """grades.csv's view of a result is made by grader.batch.outputs.load_views from the grading.json
    the pipeline wrote, for every route; no route builds it from a result in memory."""
    users = sorted(m for m, p in modules().items() if m != "grader.batch.outputs"
                   and "gradebook_view" in {getattr(n, "id", getattr(n, "attr", getattr(n, "name", "")))
                                            for n in ast.walk(ast.parse(p.read_text()))})
    assert not users, f"read the results back with grader.batch.outputs.load_views instead: {users}"
