"""How a check's numbers reach a student: as they are at a public check, named at a hidden one.

A hidden check's values (seed, sizes, micro-batches, world size, nodes) and every number derived
from them (a local batch, a micro-batch, a shard's width, a ratio of updates, a difference) are
secret. Messages are built from structured values through `Say`, once, where the verdict is
made: at a public check `say.num(4, "world_size")` is "4"; at a hidden one it is "world_size",
and a ratio or a difference is said in words. Nothing is masked afterwards, so a headline and the
line under it say the same thing and "assignment4.py" keeps its name.

Text that is not ours (an exception's message, what a rank printed) never reaches a hidden check's
messages: grader.rerun.wire.hidden keeps only the exception's type and the hand-in's own lines where
the re-run's results come in, since no mask catches every spelling of a number (torch's "input of
size 165" is 15 x 11; a hand-in may print in hex). `say.text` still replaces the check's secret
numbers, as whole numbers, by "#" in what is said of a rank (a second guard, not the first);
numbers that a public check shares are not secret.
"""

import re

CONFIG = ("seed", "global_batch_size", "input_dim", "output_dim", "accumulation_steps", "world_size", "nodes")


def numbers(check) -> set:
    """The numbers a check's configuration states or implies."""
    values = {getattr(check, key) for key in CONFIG}
    ws, steps = check.world_size, check.accumulation_steps
    values |= {check.global_batch_size // ws, check.global_batch_size // steps, check.output_dim // ws,
               ws // max(check.nodes, 1), check.global_batch_size * check.output_dim}
    return {v for v in values if isinstance(v, int)}


class Say:
    """Says a check's numbers (see the module docstring)."""

    def __init__(self, check=None, public=()):
        self.hidden = bool(check is not None and check.hidden)
        shown = set().union(*(numbers(c) for c in public)) if public else set()
        self.secrets = sorted(numbers(check) - shown - {0, 1}, reverse=True) if self.hidden else []

    def num(self, value, name: str) -> str:
        """`value` at a public check, `name` at a hidden one."""
        return name if self.hidden else f"{value}"

    def eq(self, value, name: str) -> str:
        """"name = value" at a public check, "name" at a hidden one."""
        return name if self.hidden else f"{name} = {value}"

    def rank(self, rank: int, name: str = "one rank") -> str:
        return name if self.hidden else f"rank {rank}"

    def ranks(self, failing, total: int) -> str:
        """Which ranks: "every rank", "rank 2", "ranks 1, 3"; at a hidden check "some ranks"."""
        failing = sorted(failing)
        if len(failing) == total:
            return "every rank"
        if self.hidden:
            return "some ranks" if len(failing) > 1 else "one rank"
        return f"rank{'s' if len(failing) > 1 else ''} {', '.join(map(str, failing))}"

    def text(self, text: str) -> str:
        """What is said of a rank (at a hidden check already without its own words, see the module
        docstring), its secret numbers replaced by "#"."""
        text = text or ""
        for value in self.secrets:
            text = re.sub(rf"(?<![\w.]){value}(?![\w]|\.\d)", "#", text)
        return text
