"""The wheel as pyproject.toml describes it, plus copies of the kit's top-level files that commands
read (grader.kit.TOP_FILES: pyproject.toml, the requirements, the students' README) in grader/top/:
installed, the kit's packages sit in site-packages, which has no top folder of the kit to read them
from. (`pip install -e .` needs no copies: the clone's own files are read.)"""

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from grader import kit  # noqa: E402  (the standard library only: safe to import while building)


class BuildWithTopFiles(build_py):
    """build_py, then TOP_FILES copied beside the grader package's modules."""

    def run(self):
        super().run()
        if self.editable_mode:
            return
        for rel in kit.TOP_FILES:
            if (HERE / rel).is_file():   # the student release has no requirements-test.txt
                target = Path(self.build_lib) / "grader" / kit.WHEEL_TOP / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(HERE / rel, target)


setup(cmdclass={"build_py": BuildWithTopFiles})
