"""How a part is judged at a kind of check: its record names a `Judging` (grader.parts: `judging`).

A Judging is two functions of the verdict's:

    expected(check, lr, data, part)   the reference, in float64, from the data the part's run was
                                      served (data: the run's protocol.PartSecret)
    judge(run, exp, part, check, tol, say, passed)   the run's CheckOutcome against it

The record names it as "module:NAME" (the Judging called NAME of a module of this room), not by an
import: the parts are the ranks' to import, and the verdict's code is not (grader.rerun.bwrap.ENGINE).
Each module that judges holds its own: compare (a step of one weight), backward (a layer run
alone), megatron (Part 5's block, at both kinds).
"""

import importlib
from dataclasses import dataclass
from typing import Callable

from grader.parts import BY_ID


@dataclass(frozen=True)
class Judging:
    expected: Callable   # (check, lr, data, part) -> the reference
    judge: Callable      # (run, exp, part, check, tol, say, passed) -> CheckOutcome


def judging(part: str, kind: str) -> Judging:
    """The Judging `part`'s record names for checks of `kind`."""
    module, _, name = BY_ID[part].judging[kind].partition(":")
    assert module.startswith("grader.verdict."), f"{part}: a Judging outside grader.verdict: {module}"
    found = getattr(importlib.import_module(module), name)
    assert isinstance(found, Judging), f"{part}: {module}:{name} is not a Judging"
    return found
