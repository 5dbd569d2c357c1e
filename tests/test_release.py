"""The student release: what it holds, that nothing in it gives the answer away, and that it works
on its own from a fresh copy, with nothing of this repository on the Python path: a student's
whole path from the untouched skeleton (run, check, package) to a pasted-in solution (package),
and the graders' batch grading both zips it built."""

import ast
import csv
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from grader.batch.run import grade_batch
from grader import kit
from grader.instructor.config import reference_constants
from grader.instructor.handout import points_are_current, points_table
from grader.instructor.lab import ANSWERS, answer_traces
from grader.instructor.leaks import rename_hint
from grader.instructor.release import ReleaseError, build_release, find_leaks
from grader.instructor.skeleton import make_skeleton
from grader.parts import BY_ID, OPTIONAL_PART_IDS
from grader.rubric import load_rubric, public_rubric, rubric_from_dict
from tests.corpus import FULL_CSV, REFERENCE, ROOT, fast_rubric, with_part5

pytestmark = pytest.mark.student   # make test-student runs these; make test leaves them out

SKELETON = ROOT / "assignment_4" / "assignment4.py"
SHIPPED_THIRD_PARTY = {"torch", "yaml", "numpy"}
# Imported only inside a function, by code the student tools never run: grader/plots.py (the lab's
# bandwidth plot; student/requirements.txt does not pin matplotlib) and grader/kit.py's page_template
# (the staff pages; Jinja2 comes with torch, pinned in student/requirements.txt).
OPTIONAL_THIRD_PARTY = {"matplotlib", "jinja2"}


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "a4"
    build_release(out)
    return out


def files_of(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes().decode("utf-8", "replace")
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_release_holds_the_kit_and_the_student_tools(release):
    names = set(files_of(release))
    assert {"README.md", "requirements.txt", "assignment_4/assignment4.py", "assignment_4/utils.py",
            "assignment_4/README.md", "slurm/run-local.sh", "slurm/common.sh", "slurm/submit.py",
            "grader/rubric-public.yaml"} <= names
    # The committed skeleton, less the optional parts the course leaves off.
    without = tuple(p for p in OPTIONAL_PART_IDS if p not in load_rubric().parts)
    assert (release / "assignment_4" / "assignment4.py").read_text() == make_skeleton(REFERENCE.read_text(),
                                                                                      "assignment4.py", without=without)
    assert not any(n.startswith(("tests/", "student/")) for n in names)
    assert os.access(release / "slurm" / "run-local.sh", os.X_OK)


def test_the_release_ships_whole_rooms_and_slurm_whole(release):
    """grader/ is the shared modules and the rooms check and package run on, each copied whole;
    slurm/ is copied whole, lab/ less the files that answer the assignment; nothing of the graders'
    rooms or rubric."""
    shipped = {p.relative_to(release / "grader").as_posix() for p in (release / "grader").rglob("*") if p.is_file()}
    expected = {rel.as_posix() for rel in kit.grader_files(kit.HANDIN_ROOMS + ("student",))} | {"rubric-public.yaml"}
    assert shipped == expected
    for rel in expected - {"rubric-public.yaml"}:
        assert (release / "grader" / rel).read_bytes() == (kit.GRADER / rel).read_bytes(), rel
    for folder, left_out in (("slurm", set()), ("lab", set(ANSWERS))):
        ours = {p.relative_to(ROOT).as_posix() for p in (ROOT / folder).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
        assert ours - left_out == {p.relative_to(release).as_posix() for p in (release / folder).rglob("*")
                                   if p.is_file()}


def test_the_release_command_line_offers_only_the_student_tools(release):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "grader", "--help"], cwd=release, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    offered = set(re.findall(r"^    (\S+)", proc.stdout, re.M))
    assert offered == {"check", "package", "doctor"}, proc.stdout   # doctor: why a check finds no sandbox


def test_no_file_of_the_release_holds_the_solution_or_a_hidden_check(release):
    reference = REFERENCE.read_text()
    blocks = re.findall(r"# BEGIN SOLUTION[^\n]*\n(.*?)# END SOLUTION", reference, re.S)
    given = {line.strip() for line in SKELETON.read_text().splitlines()}
    solution = {line.strip() for block in blocks for line in block.splitlines()} - given - {""}
    assert len(solution) >= 10
    hidden = [c for c in yaml.safe_load((ROOT / "grader" / "rubric.yaml").read_text())["checks"] if c.get("hidden")]
    assert hidden
    for name, text in files_of(release).items():
        assert "reference" not in name.split("/")
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "REFERENCE ONLY"):
            assert marker not in text, (name, marker)
        for line in solution:
            assert line not in text, (name, line)
        for check in hidden:
            assert check["name"] not in text, (name, check["name"])
            assert not re.search(rf"\bseed\W{{0,3}}{check['seed']}\b", text), (name, check["seed"])
            assert f"{check['input_dim']}x{check['output_dim']}" not in text, (name, check)
    assert find_leaks(release) == []


def test_a_leak_is_found_and_refused(release, tmp_path):
    leaky = tmp_path / "leaky"
    shutil.copytree(release, leaky)
    (leaky / "notes.md").write_text("    dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n")
    hidden = next(c.name for c in load_rubric().checks if c.hidden)
    (leaky / "grader" / "extra.yaml").write_text(f"- {{name: {hidden}, hidden: true}}\n")
    shutil.copytree(ROOT / "assignment_4" / "reference", leaky / "assignment_4" / "reference")
    leaks = find_leaks(leaky)
    assert "notes.md: has the solution line 'dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)'" in leaks
    assert f"grader/extra.yaml: names hidden check '{hidden}' or its values" in leaks
    assert "assignment_4/reference/assignment4.py: must not be in a release" in leaks
    with pytest.raises(ReleaseError, match="is not an empty folder"):
        build_release(leaky)


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None, p.stat().st_mode)
            for p in sorted(folder.rglob("*"))}


def test_a_refused_release_leaves_the_previous_one_in_place_and_a_good_one_replaces_it(release, tmp_path):
    out = tmp_path / "build" / "release"
    shutil.copytree(release, out)
    before = _snapshot(out)
    # A kit whose job scripts hold a solution line: refused at the last step, the leak scan.
    kit_copy = kit_copy_of(tmp_path)
    (kit_copy / "slurm" / "notes.md").write_text("    dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n")
    with pytest.raises(ReleaseError, match="would leak"):
        build_release(out, root=kit_copy, replace=True)
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["release"]   # nothing half-built left beside it
    with pytest.raises(ReleaseError, match="not an empty folder"):     # without --replace: refused, untouched
        build_release(out)
    assert _snapshot(out) == before
    (out / "stale.txt").write_text("from the release before\n")
    build_release(out, replace=True)
    assert not (out / "stale.txt").exists() and _snapshot(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["release"]
    with pytest.raises(ReleaseError, match="nor a release"):   # --replace replaces only a release
        build_release(tmp_path / "kit", replace=True)
    assert "rm -rf" not in (ROOT / "Makefile").read_text().split("\nrelease:")[1].split("\n\n")[0]


def test_the_release_ships_the_public_rubric_derived_from_the_graders(release):
    """One source: rubric-public.yaml is written from grader/rubric.yaml, complete in itself."""
    shipped = rubric_from_dict(yaml.safe_load((release / "grader" / "rubric-public.yaml").read_text()))
    assert shipped == public_rubric(load_rubric())
    assert not any(c.hidden for c in shipped.checks) and shipped.public_world_sizes == []


def test_the_student_tools_import_only_what_the_release_holds(release):
    shipped = {p.stem for p in (release / "grader").glob("*.py")} | \
        {p.parent.name for p in (release / "grader").glob("*/__init__.py")}   # and its packages: parts, rooms
    for path in [*(release / "grader").glob("*.py"), *(release / "grader" / "parts").glob("*.py"),
                 *(release / "assignment_4").glob("*.py")]:
        tree = ast.parse(path.read_text())
        lazy = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module] + ([f"grader.{a.name}" for a in node.names] if node.module == "grader" else [])
            else:
                continue
            for name in names:
                top, _, sub = name.partition(".")
                if top == "grader":
                    assert not sub or sub.split(".")[0] in shipped or sub == "__version__", (path.name, name)
                else:
                    optional = OPTIONAL_THIRD_PARTY if id(node) in lazy else set()
                    assert top in sys.stdlib_module_names or top in SHIPPED_THIRD_PARTY | optional | {"utils"}, \
                        (path.name, name)


def test_the_student_requirements_pin_what_the_kit_pins():
    def pins(path):
        return dict(re.findall(r"^([A-Za-z][\w.-]*)==(\S+)", path.read_text(), re.M))
    ours, theirs = pins(ROOT / "requirements.txt"), pins(ROOT / "student" / "requirements.txt")
    assert {"torch", "numpy", "PyYAML"} <= set(theirs)
    assert {name: ours.get(name) for name in theirs} == theirs


@pytest.fixture(scope="module")
def student(release, reference_run_files, tmp_path_factory):
    """A student's path through a fresh copy of the release, as subprocesses run from its top folder
    with only the copy on PYTHONPATH; returns the copy and each command's completed process."""
    kit = tmp_path_factory.mktemp("student") / "a4"
    shutil.copytree(release, kit)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "A4_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", PYTHONPATH=str(kit))

    def run(*args):
        return subprocess.run(list(args), cwd=kit, env=env, capture_output=True, text=True, timeout=300)

    steps = {"where": run(sys.executable, "-c", "import grader; print(grader.__file__)")}
    # The untouched skeleton: run it as the job would, check, package (the zip is written anyway).
    steps["run"] = run("slurm/run-local.sh")
    steps["check skeleton"] = run(sys.executable, "-m", "grader", "check")
    steps["package skeleton"] = run(sys.executable, "-m", "grader", "package", "-o", "skeleton-handin.zip")
    # The solution pasted in, and its run (the session's run of the very same bytes) left where
    # Slurm leaves it, newer than the skeleton's.
    shutil.copyfile(REFERENCE, kit / "assignment_4" / "assignment4.py")
    for path in reference_run_files:
        shutil.copyfile(path, kit / path.name)
    steps["package solution"] = run(sys.executable, "-m", "grader", "package")
    return kit, steps


@pytest.mark.timeout(600)
def test_from_a_fresh_copy_check_fails_on_the_skeleton_and_passes_with_the_solution(student, reference_run_files):
    kit, steps = student
    assert Path(steps["where"].stdout.strip()).resolve() == (kit / "grader" / "__init__.py").resolve()
    assert steps["run"].returncode == 0, steps["run"].stderr

    skeleton = steps["check skeleton"]
    assert skeleton.returncode == 1, skeleton.stderr
    assert "Public checks of assignment_4/" in skeleton.stdout
    parts = load_rubric().part_ids   # every part the course grades is a TODO in the skeleton
    assert f"{len(parts)} parts fail public checks: {', '.join(parts)}" in skeleton.stdout
    assert skeleton.stdout.count("not_implemented") == len(parts)

    packaged = steps["package skeleton"]
    assert packaged.returncode == 1 and "is written, but it does not pass every public check" in packaged.stdout

    solution = steps["package solution"]
    assert solution.returncode == 0, solution.stdout + solution.stderr
    assert f"run:   {reference_run_files[0].name}" in solution.stdout
    assert "Public checks of assignment4-handin.zip" in solution.stdout
    assert "All public checks passed." in solution.stdout and "assignment4-handin.zip is ready to hand in" in solution.stdout
    with zipfile.ZipFile(kit / "assignment4-handin.zip") as z:
        assert sorted(z.namelist()) == sorted(["assignment4.py", "utils.py", *(p.name for p in reference_run_files)])


@pytest.mark.timeout(600)
def test_the_graders_give_the_zips_package_built_full_marks_and_zero(student, tmp_path):
    kit, _ = student
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    shutil.copyfile(kit / "assignment4-handin.zip", inbox / "solution.zip")
    shutil.copyfile(kit / "skeleton-handin.zip", inbox / "skeleton.zip")
    summary = grade_batch([inbox], tmp_path / "out", rubric_path=fast_rubric(tmp_path), progress=False)
    assert summary.statuses == {"graded": 2}
    rows = {row["student"]: row for row in csv.DictReader((tmp_path / "out" / "grades.csv").open())}
    assert (rows["solution"]["score"], rows["solution"]["flags"]) == (FULL_CSV, "")
    assert rows["skeleton"]["score"] == "0"


def _readme_commands(readme: str, heading: str) -> list:
    """The command lines of the first bash block under `heading`, comments dropped."""
    section = readme[readme.index(heading):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_every_link_and_path_the_release_readmes_name_is_in_the_release(release):
    for doc in [release / "README.md", *(release / "slurm").glob("*.md"), *(release / "assignment_4").glob("*.md"),
                *(release / "lab").glob("*.md")]:
        text = doc.read_text()
        for link in re.findall(r"\]\(([^)#\s]+)", text):
            if not link.startswith(("http://", "https://")):
                assert (doc.parent / link).exists() or (release / link).exists(), (doc.name, link)
        for path in re.findall(r"`((?:assignment_4|slurm|grader|lab)/[\w./-]+)`", text):
            if "<" not in path and "*" not in path and "mycluster" not in path:   # made by the student
                assert (release / path).exists() or (doc.parent / path).exists(), (doc.name, path)
        # Nothing the release does not ship: no make targets, no test files, no instructors' README.
        assert not re.search(r"\bmake (venv|test|demo|release|skeleton|bench)", text), doc.name
        assert "tests/" not in text and "top-level README" not in text, doc.name
    for script in [*(release / "slurm").glob("*.sh"), *(release / "slurm").glob("*.sbatch"),
                   *(release / "slurm").rglob("*.yaml")]:
        text = script.read_text()
        assert "tests/" not in text and not re.search(r"\bmake (venv|test)", text), script.name


def test_the_release_requirements_install_everything_it_ships(release):
    pins = dict(re.findall(r"^([A-Za-z][\w.-]*)==(\S+)", (release / "requirements.txt").read_text(), re.M))
    assert {"torch", "numpy", "PyYAML", "submitit", "cloudpickle"} <= set(pins)
    readme = (release / "README.md").read_text()
    assert "--index-url https://download.pytorch.org/whl/cpu torch==" + pins["torch"] in readme


@pytest.mark.configs   # a student's fresh folder: make test-configs
@pytest.mark.timeout(600)
def test_a_student_follows_the_release_readme_literally_from_a_fresh_folder(release, tmp_path):
    """The README's own commands, from "From TODO to hand-in", run as written in a fresh copy (the
    solution in place of the TODOs, as a student who finished; no cluster, so no sbatch), then the
    launcher's --local run: every one succeeds, and the zip to hand in is there."""
    folder = tmp_path / "a4"
    shutil.copytree(release, folder)
    shutil.copyfile(REFERENCE, folder / "assignment_4" / "assignment4.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "A4_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    commands = _readme_commands((folder / "README.md").read_text(), "## From TODO to hand-in")
    assert [c.split()[0] for c in commands] == ["torchrun", "slurm/run-local.sh", "sbatch", "python", "python"]
    for command in commands + ["python -m slurm.submit --local"]:
        if command.startswith("sbatch"):
            continue
        done = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    assert (folder / "assignment4-handin.zip").is_file()
    logs = sorted(p.name for p in folder.glob("assignment4-*.log"))
    assert len(logs) == 2 and any("local-" in name for name in logs)   # run-local.sh's and the launcher's
    assert not (folder / "build").exists()                               # the launcher left no folder


def kit_copy_of(tmp_path) -> Path:
    """The parts of the kit a release is built from, copied: an instructor's working copy."""
    copy = tmp_path / "kit"
    for part in ("assignment_4", "grader", "slurm", "lab", "student"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def test_release_refuses_a_configuration_said_differently_and_names_file_and_value(tmp_path):
    from grader.instructor.skeleton import make_skeleton
    copy = kit_copy_of(tmp_path)
    reference = copy / "assignment_4" / "reference" / "assignment4.py"
    batch = reference_constants(reference)["global_batch_size"]
    default = load_rubric().default_check
    reference.write_text(reference.read_text().replace(f"global_batch_size = {batch} ",
                                                       f"global_batch_size = {2 * batch} ", 1))
    (copy / "assignment_4" / "assignment4.py").write_text(make_skeleton(reference.read_text()))
    with pytest.raises(ReleaseError) as refused:
        build_release(tmp_path / "out", root=copy)
    message = str(refused.value)
    assert (f"assignment_4/reference/assignment4.py sets global_batch_size = {2 * batch} but grader/rubric.yaml's "
            f"check '{default.name}' has global_batch_size: {batch}") in message
    assert f"assignment_4/README.md says global_batch_size is {batch}" in message
    assert not (tmp_path / "out").exists()


def test_release_refuses_a_handout_that_tells_of_other_public_checks(tmp_path):
    """The handout tells students the world sizes `check` runs at; the public rubric decides them."""
    copy = kit_copy_of(tmp_path)
    rubric = copy / "grader" / "rubric.yaml"
    data = yaml.safe_load(rubric.read_text())
    size = load_rubric().default_check.world_size
    data["public_world_sizes"] = [size]   # the default check at its own size only
    rubric.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ReleaseError) as refused:
        build_release(tmp_path / "out", root=copy)
    assert "assignment_4/README.md says the check runs \"in worlds of" in str(refused.value)
    assert f"the public rubric's checks run at world sizes {size} (grader/rubric.yaml: public_world_sizes)" \
        in str(refused.value)


def test_a_hidden_check_named_with_a_common_word_is_refused_with_rename_the_check(release, tmp_path):
    leaky = tmp_path / "leaky"
    shutil.copytree(release, leaky)
    hidden = next(c.name for c in load_rubric().checks if c.hidden)
    for name in ("a.md", "b.md", "c.md"):
        (leaky / name).write_text(f"run the {hidden} case\n")
    leaks = find_leaks(leaky)
    hint = rename_hint(leaks)
    assert f"hidden check '{hidden}' is named in 3 files" in hint and "rename the check in grader/rubric.yaml" in hint


PART5_WORDS = ("megatron_mlp", "MegatronMLP", "RowParallelLinear", "ReduceParallel", "hidden_dim", "Part 5",
               "BEGIN PART", "END PART")


def test_a_course_that_leaves_part_5_off_ships_no_trace_of_it(release, tmp_path):
    """The stock course leaves the optional Part 5 off: the skeleton, the handout, the README and
    the public rubric never name it, and a trace left in refuses the release."""
    assert "megatron_mlp" not in load_rubric().parts
    files = files_of(release)
    for name in ("README.md", "assignment_4/assignment4.py", "assignment_4/README.md", "grader/rubric-public.yaml"):
        for word in PART5_WORDS:
            assert word not in files[name], (name, word)
    ast.parse(files["assignment_4/assignment4.py"])
    assert "class FullColumnParallelLinear" in files["assignment_4/assignment4.py"]
    leaky = tmp_path / "leaky"
    shutil.copytree(release, leaky)
    handout = leaky / "assignment_4" / "README.md"
    handout.write_text(handout.read_text() + "\n## Part 5 (optional): Megatron's MLP block\n")
    leaks = find_leaks(leaky, without=("megatron_mlp",))
    assert leaks == ["assignment_4/README.md: names Part 5 (optional): Megatron's MLP block, which this course "
                     "leaves off ('Part 5')"]


def _part5_solution(reference: str) -> set:
    """The solution lines of Part 5: in a SOLUTION block inside its PART blocks, nowhere else."""
    parts = "".join(re.findall(r"# BEGIN PART megatron_mlp\n(.*?)# END PART megatron_mlp", reference, re.S))
    blocks = re.findall(r"# BEGIN SOLUTION[^\n]*\n(.*?)# END SOLUTION", parts, re.S)
    given = {line.strip() for line in SKELETON.read_text().splitlines()}
    return {line.strip() for block in blocks for line in block.splitlines()} - given - {""}


@pytest.mark.timeout(900)
def test_a_course_with_part_5_ships_it_and_check_grades_it(tmp_path, reference_run_files):
    copy = kit_copy_of(tmp_path)
    rubric = copy / "grader" / "rubric.yaml"
    data = with_part5(yaml.safe_load(rubric.read_text()))
    data["parts"]["megatron_mlp"] = {"log": 3, "rerun": 12, "bonus": True}   # not the kit's 2 and 8
    rubric.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "release"
    build_release(out, root=copy)
    files = files_of(out)
    # The committed skeleton, Part 5 in, and without the optional parts this course leaves off.
    off = tuple(p for p in OPTIONAL_PART_IDS if p not in data["parts"])
    assert files["assignment_4/assignment4.py"] == make_skeleton(REFERENCE.read_text(), without=off)
    assert not off or files["assignment_4/assignment4.py"] != SKELETON.read_text()
    assert "raise NotImplementedError('TODO in RowParallelLinear.forward" in files["assignment_4/assignment4.py"]
    handout = files["assignment_4/README.md"]
    assert "## Part 5 (optional): Megatron's MLP block" in handout
    # The handout says what this course's rubric says: Part 5's sentence and its row of the table.
    assert ("This part is optional: it earns 15 bonus points on top of Parts 1-4 (3 for the log and 12 for the "
            "re-run), and leaving it as a `TODO` costs nothing.") in handout
    assert "| Part 5 (optional): Megatron's MLP block, a bonus | 12 | 3 | 15 |" in handout
    total = sum(p["log"] + p["rerun"] for p in data["parts"].values() if not p.get("bonus"))   # 100 in the stock course
    bonus = sum(p["log"] + p["rerun"] for p in data["parts"].values() if p.get("bonus"))   # 15, and any other part's
    assert f"| **all parts** | | | **{total:g}**, and {bonus:g} bonus on top |" in handout
    part5 = handout.split("## Part 5 (optional)", 1)[1].split("\n## ", 1)[0]   # its section: not the kit's points
    assert "2 for the log" not in part5 and "8 for the re-run" not in part5
    assert not any(marker in text for text in files.values() for marker in ("BEGIN PART", "END PART", "BEGIN POINTS"))
    public = yaml.safe_load(files["grader/rubric-public.yaml"])
    assert public["parts"]["megatron_mlp"] == {"log": 3.0, "rerun": 12.0, "bonus": True}
    widths = {c.get("hidden_dim", 128) for c in data["checks"] if not c.get("hidden")}
    assert {c["hidden_dim"] for c in public["checks"]} == widths
    # The scan covers Part 5's solution as it covers Parts 1-4's.
    solution = _part5_solution(REFERENCE.read_text())
    assert "out = ReduceFromModelParallelRegion.apply(partial)" in solution and len(solution) >= 6
    assert not any(line in text for line in solution for text in files.values())
    (out / "notes.md").write_text("        out = ReduceFromModelParallelRegion.apply(partial)\n")
    assert "notes.md: has the solution line 'out = ReduceFromModelParallelRegion.apply(partial)'" in \
        find_leaks(out, copy)
    # A student's check grades Part 5: the solution pasted in passes it, with its log.
    (out / "notes.md").unlink()
    shutil.copyfile(REFERENCE, out / "assignment_4" / "assignment4.py")
    for path in reference_run_files:
        shutil.copyfile(path, out / path.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "A4_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", PYTHONPATH=str(out))
    checked = subprocess.run([sys.executable, "-m", "grader", "check"], cwd=out, env=env, capture_output=True,
                             text=True, timeout=600)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    row = next(line for line in checked.stdout.splitlines() if line.startswith("Part 5"))
    assert "passed  passed" in row, checked.stdout


def test_the_handout_states_the_rubrics_points_and_nothing_else_does(release):
    """The committed handout's points are grader/rubric.yaml's (`python -m grader skeleton` writes
    them), the release's too, and no guide states a number of points outside them."""
    rubric = load_rubric()
    assert points_are_current(rubric)
    handout = (release / "assignment_4" / "README.md").read_text()
    assert points_table(rubric) in handout
    for part, p in rubric.parts.items():
        assert f"| {p.rerun:g} | {p.log:g} | {p.rerun + p.log:g} |" in handout, part
    err = rubric.files.penalty_missing_err
    assert not err or f"Taken off the total: a hand-in without the run's `.err` costs {err:g} points." in handout


def test_the_shipped_lab_holds_no_answer_and_runs_what_it_holds(release, tmp_path):
    """No file of the release's lab answers a TODO (the files the map names are left out, and no
    other's code all-reduces a gradient or defines f or g), its README does not name them, and its
    run_all runs the parts it holds and names the others."""
    assert not [rel for rel in ANSWERS if (release / rel).exists()]
    for path in (release / "lab").glob("*.py"):
        assert answer_traces(path.read_text()) == [], path.name
    readme = (release / "lab" / "README.md").read_text()
    assert "LAB ANSWERS" not in readme and "data_parallel.py" not in readme and "tensor_parallel.py" not in readme
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "A4_"))}
    env.update(A4_LAB_MAX_SIZE="4K", A4_LAB_OUT=str(tmp_path))
    ran = subprocess.run([sys.executable, "lab/run_all.py"], cwd=release, env=env, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ("[lab:all][Rank 0] ok: True | collectives | not in this copy of the lab: data_parallel, "
            "tensor_parallel, pipeline_parallel, vocab_parallel, transformer") in ran.stdout


def test_the_lab_map_names_every_lab_file_that_answers_a_todo():
    """grader/instructor/lab.py's ANSWERS is the lab as it is: every file it names answers what it
    says (the ones whose answer code can be found, found), every other lab file answers nothing,
    and the lab's README tells the instructor the same files and parts."""
    traced = {p.relative_to(ROOT).as_posix() for p in (ROOT / "lab").glob("*.py") if answer_traces(p.read_text())}
    assert traced == {"lab/data_parallel.py", "lab/tensor_parallel.py", "lab/mappings.py", "lab/vocab_parallel.py"}
    assert traced <= set(ANSWERS)
    assert all((ROOT / rel).is_file() for rel in ANSWERS)
    section = (ROOT / "lab" / "README.md").read_text().split("## In a students' release")[1]
    for rel, parts in ANSWERS.items():
        assert f"`{rel.split('/')[1]}`" in section
        for part in parts:
            assert BY_ID[part].title.split(":")[0].replace(" (optional)", "") in section, (rel, part)


def test_the_lab_answers_flag_ships_the_lab_whole_and_says_which_files_answer(tmp_path, capsys):
    from grader.cli import main
    assert main(["release", "--out", str(tmp_path / "whole"), "--lab-answers"]) == 0
    printed = capsys.readouterr().out
    assert "the lab's files that answer the assignment, shipped (--lab-answers):" in printed
    assert "lab/data_parallel.py: Part 3's TODOs: the all-reduce of every gradient" in printed
    assert all((tmp_path / "whole" / rel).is_file() for rel in ANSWERS)
    assert "LAB ANSWERS" not in (tmp_path / "whole" / "lab" / "README.md").read_text()


def test_a_refused_release_names_every_place_that_disagrees_in_one_run(tmp_path):
    """A kit with a stale skeleton, a configuration said differently, a number of points typed into
    the handout, a solution line in the job scripts and a lab file that all-reduces gradients: one
    refusal names all five, and nothing is written."""
    copy = kit_copy_of(tmp_path)
    (copy / "assignment_4" / "assignment4.py").write_text(SKELETON.read_text() + "\n# edited by hand\n")
    handout = copy / "assignment_4" / "README.md"
    batch = reference_constants(copy / "assignment_4" / "reference" / "assignment4.py")["global_batch_size"]
    text = handout.read_text().replace(f"never assume the numbers {batch}, ", f"never assume the numbers {batch + 1}, ")
    handout.write_text(text.replace("## Part 1:", "Part 3 is worth 35 points.\n\n## Part 1:", 1))
    (copy / "slurm" / "notes.md").write_text("    dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n")
    (copy / "lab" / "zero.py").write_text("import torch.distributed as dist\n\n\ndef sync(model):\n"
                                          "    for p in model.parameters():\n        dist.all_reduce(p.grad)\n")
    with pytest.raises(ReleaseError) as refused:
        build_release(tmp_path / "out", root=copy)
    message = str(refused.value)
    assert "nothing was written; 5 place(s) to fix, all of them:" in message
    assert "assignment_4/assignment4.py differs from what the reference generates" in message
    assert f"assignment_4/README.md says global_batch_size is {batch + 1}" in message
    assert "assignment_4/README.md says '35 points' outside the points the release writes from the rubric" in message
    assert "slurm/notes.md: has the solution line 'dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)'" in message
    assert "lab/zero.py: line 6: all-reduces a gradient (Part 3's TODO)" in message
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["kit"]
