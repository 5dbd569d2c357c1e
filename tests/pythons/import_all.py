"""Every module of grader/, slurm/ and lab/ under the Python running this: each file compiles, and
each module imports, except those that need torch when this Python has none (listed, and only
those: any other failure is an error). Run by tests/pythons/test-pythons.sh from the kit's root.

    python tests/pythons/import_all.py      exit 0, or 1 naming each module that failed
"""

import importlib
import importlib.util
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("grader", "slurm", "lab")
# Modules that run on import (the command line's entry point); compiled, never imported.
ENTRY_POINTS = {"grader.__main__"}


def modules() -> list:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return found


def main() -> int:
    sys.path.insert(0, str(ROOT))
    has_torch = importlib.util.find_spec("torch") is not None
    imported, need_torch, failed = [], [], []
    for name, path in modules():
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
            if name not in ENTRY_POINTS:
                importlib.import_module(name)
            imported.append(name)
        except ModuleNotFoundError as e:
            if e.name == "torch" and not has_torch:
                need_torch.append(name)
            else:
                failed.append((name, traceback.format_exc(limit=-3)))
        except Exception:  # noqa: BLE001 - every failure is reported, then the run fails
            failed.append((name, traceback.format_exc(limit=-3)))
    version = sys.version.split()[0]
    print(f"Python {version}: {len(imported)} modules compile and import; {len(need_torch)} need torch "
          f"({'installed' if has_torch else 'not installed here'})")
    for name, error in failed:
        print(f"FAILED {name}\n{error}", file=sys.stderr)
    if not imported:
        print("no module was imported at all", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
