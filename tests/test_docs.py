"""The docs, tested like code: every relative link and anchor resolves, every repository path and
Python module named exists, every `python -m grader` / `a4` command and flag is in the command
line's own parser, every `make` target is in the Makefile, and the README's map is complete.

Torch-free: `make test-pythons` runs it under every Python.
"""

import argparse
import functools
import os
import re
import subprocess
from pathlib import Path

import pytest

from grader import cli, kit
from tests.test_layout import defined_names

ROOT = kit.ROOT
DOCS = sorted({ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "student" / "README.md",
               ROOT / "slurm" / "README.md", ROOT / "lab" / "README.md", ROOT / "assignment_4" / "README.md"})
PACKAGES = ("grader", "slurm", "lab", "tests", "benchmarks")   # dotted names under these must resolve
ALIASES = {"utils": "assignment_4.utils"}                      # the students' `utils.x` is assignment_4/utils.py
# Paths named that are not in the tree, and why.
NOT_IN_THE_TREE = {"grader/rubric-public.yaml": "the release writes it",
                   "slurm/clusters/mycluster.yaml": "a student's copy of example.yaml"}
FILE_SUFFIXES = (".py", ".sh", ".sbatch")                      # a bare name with these is a file of the kit
# Flags named alone that belong to tools other than the kit's (torchrun, sbatch, pytest, pip, run-local.sh).
FOREIGN_FLAGS = {"--standalone", "--nproc_per_node", "--nproc-per-node", "--nproc", "--partition", "--account",
                 "--gpus-per-node", "--time", "--nodes", "--error", "--label", "--index-url", "--no-deps",
                 "--cpus-per-task", "--dist", "--max-size", "--out"}


def prose(text: str) -> tuple:
    """(the text outside fenced code blocks, the fenced blocks' lines joined by line continuations).
    A block fenced as `text` is a program's output (figures.md), neither prose nor a command: left out."""
    outside, fenced, inside, output = [], [], False, False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            inside = not inside
            output = inside and line.strip().strip("`~").strip() == "text"
        elif inside:
            if not output:
                fenced.append(line)
        else:
            outside.append(line)
    return "\n".join(outside), "\n".join(fenced).replace("\\\n", " ")


def code_spans(text: str) -> list:
    """The inline code spans of `text` (outside fences), a span broken over lines joined."""
    return [" ".join(m.group(2).split()) for m in re.finditer(r"(`+)(.+?)\1", prose(text)[0], re.S)]


def slug(heading: str) -> str:
    """The anchor a forge gives a heading: markup gone, lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text.replace("`", "")).replace(" ", "-")


def anchors(path: Path) -> set:
    found, seen = set(), {}
    for line in prose(path.read_text())[0].splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if heading:
            base = slug(heading.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(doc: Path, text: str = None) -> list:
    """Every relative link of `doc` whose file, or #anchor, is not there."""
    text = doc.read_text() if text is None else text
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(text)[0]):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(target)
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(target)
    return broken


@functools.lru_cache(maxsize=1)
def kit_files() -> frozenset:
    """The names of the kit's files (not the venv's, not build outputs)."""
    names = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in (".git", "build", "__pycache__", ".pytest_cache")
                   and not d.startswith(".venv")]   # .venv, .venv-cuda: installed, not the kit's
        names |= set(files)
    return frozenset(names)


def module_file(dotted: str):
    """The file of a module or package of the kit, or None."""
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return base if base.is_dir() else None


def stale_module(name: str) -> bool:
    """True when a dotted name (grader.rerun.wire.secret, grader.kit.HANDIN_ROOMS, utils.create_batch) names
    nothing: its longest module prefix must be a module, and the next part defined there."""
    head, *rest = name.rstrip("()").split(".")
    parts = ALIASES.get(head, head).split(".") + rest
    known = max((k for k in range(1, len(parts) + 1) if module_file(".".join(parts[:k]))), default=0)
    if known == 0:
        return True
    if known == len(parts):
        return False
    file = module_file(".".join(parts[:known]))
    return file.is_dir() or parts[known] not in defined_names(file)


def stale_names(doc: Path, text: str = None) -> list:
    """The repository paths and Python modules named in `doc`'s code spans (and grader.* names
    anywhere) that do not exist."""
    text = doc.read_text() if text is None else text
    tops = {p.name for p in ROOT.iterdir()}
    stale = []
    for span in code_spans(text):
        for token in re.split(r"[\s,;()]+", span):
            token = token.strip(".:'\"[]")
            if "/" in token and token.split("/")[0] in tops and not token.startswith(("build/",)):
                pattern = re.sub(r"<[^>]*>", "*", token.rstrip("/"))
                if token not in NOT_IN_THE_TREE and not list(ROOT.glob(pattern)):
                    stale.append(token)
            elif "/" not in token and token.endswith(FILE_SUFFIXES) and "*" not in token and "<" not in token:
                if not (doc.parent / token).exists() and token not in kit_files():
                    stale.append(token)
            elif re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(\(\))?", token) and \
                    token.split(".")[0] in (*PACKAGES, *ALIASES) and not token.endswith((".md", ".yaml", ".sbatch")):
                stale += [token] if stale_module(token) else []
    for name in re.findall(r"(?<![\w./-])grader(?:\.[A-Za-z_]\w*)+", text):
        stale += [name] if stale_module(name) and name not in stale else []
    return stale


def parsers() -> dict:
    """'grader' -> {command: its option strings} from grader.cli's parser; 'slurm.submit' likewise."""
    def options(parser):
        return {s for a in parser._actions for s in a.option_strings}
    top = cli.build_parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    from slurm import submit
    return {"grader": {"": options(top), **{n: options(p) for n, p in commands.items()}},
            "slurm.submit": {"": options(submit.build_parser())}}


def benchmark_flags() -> set:
    """The options the benchmarks' own parsers take (benchmarks/*.py; a doc names them alone)."""
    return {flag for script in (ROOT / "benchmarks").glob("*.py")
            for flag in re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", script.read_text())}


def bad_commands(doc: Path, text: str = None) -> list:
    """Every `python -m grader` / `a4` / `python -m slurm.submit` command of `doc` that names a
    command or a flag the parser does not have, and every flag named alone that no command or
    benchmark takes."""
    text = doc.read_text() if text is None else text
    known, bad = parsers(), []
    fenced = prose(text)[1]
    spans = code_spans(text)
    pieces = fenced.splitlines() + spans
    pattern = r"(?:^|[\s(`$])(?:python3? -m (grader|slurm\.submit)|(a4)) ([^#;&|)`]*)"
    for piece in pieces:
        for m in re.finditer(pattern, piece):
            tool = "grader" if m.group(2) else m.group(1)
            tokens = [t.strip("[],.'\"") for t in m.group(3).split()]
            command = "" if tool == "slurm.submit" or not tokens or tokens[0].startswith("-") else tokens[0]
            if command in ("COMMAND", "...") or command.isupper():
                continue
            if command not in known[tool]:
                bad.append(f"{tool} {command}")
                continue
            for token in tokens:
                flag = token.split("=")[0]
                if re.fullmatch(r"--?[a-z][\w-]*", flag) and flag not in known[tool][command]:
                    bad.append(f"{tool} {command} {flag}".replace("  ", " "))
    every = set().union(*known["grader"].values(), *known["slurm.submit"].values(), benchmark_flags())
    for span in spans:
        flag = span.split()[0].split("=")[0] if span.startswith("--") else None
        if flag and flag not in every and flag not in FOREIGN_FLAGS:
            bad.append(flag)
    return bad


def make_targets() -> set:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def bad_make_targets(doc: Path, text: str = None) -> list:
    text = doc.read_text() if text is None else text
    named = re.findall(r"(?:^|[\s`(])make ([\w-]+)", prose(text)[1] + "\n" + "\n".join(code_spans(text)))
    return sorted(set(named) - make_targets())


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_anchors_resolve(doc):
    assert not broken_links(doc), f"{doc.relative_to(ROOT)}: broken links {broken_links(doc)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_and_modules_named_exist(doc):
    assert not stale_names(doc), f"{doc.relative_to(ROOT)} names what is not there: {stale_names(doc)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_and_flags_exist(doc):
    assert not bad_commands(doc), f"{doc.relative_to(ROOT)}: not in the command line: {bad_commands(doc)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_make_targets_exist(doc):
    assert not bad_make_targets(doc), f"{doc.relative_to(ROOT)}: no such make target {bad_make_targets(doc)}"


def test_the_readme_maps_every_folder_room_target_and_page():
    readme = (ROOT / "README.md").read_text()
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the tracked folders are unknown")
    folders = {line.split("/")[0] for line in listed.stdout.splitlines() if "/" in line} | {"docs"}
    spans = set(code_spans(readme))
    assert not {f for f in folders if f"{f}/" not in spans}, "README.md's map lacks these folders"
    assert not {r for r in kit.ROOMS if f"grader/{r}/" not in spans}, "README.md's map lacks these rooms"
    phony = re.search(r"^\.PHONY: (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    assert not {t for t in phony if f"make {t}" not in readme}, "README.md does not name every make target"
    linked = {(ROOT / t).resolve() for t in re.findall(r"\]\(([^)#\s]+)", readme)}
    assert not {p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in linked}, \
        "pages of docs/ the README does not link"


def test_the_guides_a_python_without_torch_is_sent_to_exist():
    # The full kit's page, and the release's README (student/README.md, written as README.md there).
    shipped = {"README.md": ROOT / "student" / "README.md"}
    for path, heading in cli.INSTALL_GUIDES:
        assert slug(heading) in anchors(shipped.get(path, ROOT / path)), (path, heading)


def test_it_catches_a_broken_link_a_renamed_module_and_a_removed_flag():
    doc = ROOT / "docs" / "tas.md"
    assert broken_links(doc, "See [the policy](final-grades.md#no-such-heading) and [x](nowhere.md).") == \
        ["final-grades.md#no-such-heading", "nowhere.md"]
    assert stale_names(doc, "The data comes from `grader.rerun.secrets` (`grader/rerun/secrets.py`).") == \
        ["grader.rerun.secrets", "grader/rerun/secrets.py"]
    assert stale_names(doc, "`grader.kit.NO_SUCH_NAME`, `utils.create_batch`, `grader.rerun.wire.secret`") == \
        ["grader.kit.NO_SUCH_NAME"]
    assert bad_commands(doc, "```bash\npython -m grader grade x --out y --no-such-flag\n"
                             "python -m grader regrade x\n```\nand `a4 check --log f --nope`, `--gone`.") == \
        ["grader grade --no-such-flag", "grader regrade", "grader check --nope", "--gone"]
    assert bad_make_targets(doc, "Run `make tests`, then `make test`.") == ["tests"]
    assert slug("Part 5 (optional): Megatron's `MLP` block") == "part-5-optional-megatrons-mlp-block"
