"""What a check keeps of a rank's own words: all of them at a public check; at a hidden one, the
exception's type and the hand-in's own lines, nothing else.

Every text a rank produces (an exception's message, a traceback, what it printed, its exit code,
a message it forged on the result pipe) can carry a hidden check's values: torch's "shape '[32,
64]' is invalid for input of size 165" is 15 x 11, a hidden check's local batch and input size, and
a hostile hand-in prints them in hex. Masking numbers after the fact cannot catch every spelling,
so at a hidden check none of that text is kept: `Words.error` keeps the exception's type (a
builtin's, torch's distributed and memory errors, or a class the hand-in's source defines) and the
frames of assignment4.py and utils.py (file:line in function), each checked against the code the
grader handed to the world (a line inside a definition of the function or class it names). This is
the one place where a rank's text enters the grader at a hidden check (grader.rerun.check builds
every PartRun through it), so what feedback, results.json, grades.csv, summary.md and grading.json
say of a hidden check holds no text of the rank's. What remains is a bounded channel the hand-in
chooses by its own layout (which line raised): the line numbers the handout asks students to see.
"""

import builtins
import functools
import re

from grader import outline
from grader.rerun.wire.protocol import OWN_FILES, ErrorInfo, StopReason

FRAMES_KEPT = 4          # the innermost frames of the hand-in's own files a hidden check shows
TORCH_ERRORS = ("OutOfMemoryError", "DistError", "DistBackendError", "DistNetworkError", "DistStoreError")
FRAME = re.compile(r'\s*File "([^"\n]{1,200})", line (\d{1,7}), in ([\w<>.]{1,100})\s*$')
EXCEPTION_TYPE = re.compile(r"([\w.]{1,200})(?::|$)")

# At a hidden check, why a world ended, said without the rank's words (the supervisor's detail
# quotes what a rank sent or which ranks were late).
STOPPED = {
    StopReason.LOAD_FAILED: "the code did not load",
    StopReason.START_TIMEOUT: "the ranks did not load the code in time",
    StopReason.TIMEOUT: "the part ran past its time limit",
    StopReason.RANK_DIED: "a rank exited before it finished",
    StopReason.OUT_OF_MEMORY: "the ranks and their children used more than the world's limit (limits.memory_mb)",
    StopReason.DIST_ERROR: "a collective failed",
    StopReason.RANKS_DISAGREE: "the part returned on some ranks and failed on others",
    StopReason.RANK_FAILED: "the part failed on a rank before the others finished it",
    StopReason.PROTOCOL: "a rank wrote to the grader's result channel itself",
    StopReason.INFRA_ERROR: "the world could not be started",
}


def _builtin_exception(name: str) -> bool:
    found = getattr(builtins, name, None)
    return isinstance(found, type) and issubclass(found, BaseException)


@functools.lru_cache(maxsize=16)
def spans(source: str) -> dict:
    """Function or class name -> the (first, last) lines of each definition of it in `source`;
    "<module>" spans the file. Parsed once per text, in a child process held to limits
    (grader.outline): code that does not parse there has no spans but the module's."""
    return outline.spans(source)


class Words:
    """How a rank's text is kept at one check (see the module docstring)."""

    def __init__(self, code: dict, hidden: bool):
        self.hidden = hidden
        self.spans = {name: spans(code.get(name) or "") for name in OWN_FILES} if hidden else {}
        self.defined = {name: {n for n in found if n != "<module>"} for name, found in self.spans.items()}

    def exception_type(self, exception: str) -> str:
        """The type of the exception line "Type: message", when the grader can vouch for the name."""
        match = EXCEPTION_TYPE.match((exception or "").strip()[:200])
        name = match.group(1).rsplit(".", 1)[-1] if match else ""
        defined = any(name in names for names in self.defined.values())
        return name if name and (_builtin_exception(name) or name in TORCH_ERRORS or defined) else "an exception"

    def frames(self, traceback: str) -> list:
        """"assignment4.py:57 in data_parallel_step" for each frame of the hand-in's own files, innermost last."""
        kept = []
        for line in (traceback or "").splitlines()[-400:]:
            match = FRAME.match(line[:400])
            if not match:
                continue
            name, number, function = match.group(1).rsplit("/", 1)[-1], int(match.group(2)), match.group(3)
            # A frame the source vouches for: a line inside a definition of the function it names
            # (code compiled at run time under the hand-in's file name claims lines and names at will).
            if name in OWN_FILES and any(a <= number <= b for a, b in self.spans[name].get(function, ())):
                kept.append(f"{name}:{number} in {function}")
        return kept[-FRAMES_KEPT:]

    def error(self, error: ErrorInfo) -> tuple:
        """(exception, traceback) as this check keeps them."""
        error = error or ErrorInfo()
        if not self.hidden:
            return error.exception[:2000], error.traceback[-6000:]
        frames = self.frames(error.traceback)
        where = f" at {frames[-1]}" if frames else ""
        exception = f"{self.exception_type(error.exception)}{where} (a hidden check shows no message)"
        traceback = "".join(f"  {frame}\n" for frame in frames)
        return exception, traceback

    def output(self, text: str) -> str:
        """What the ranks printed: nothing at a hidden check."""
        return "" if self.hidden else text

    def stopped(self, reason: StopReason, detail: str) -> str:
        """Why a world ended: the supervisor's detail at a public check, the reason alone at a hidden one."""
        return STOPPED.get(reason, "the world ended") if self.hidden else detail

    def rank(self, rank: int, name: str = "a rank") -> str:
        return name if self.hidden else f"rank {rank}"

    def ranks(self, ranks, total: int, name: str = "some ranks") -> str:
        """"rank 2", "ranks 1 and 3", "ranks 0, 2 and 3", "every rank"; at a hidden check `name`
        ("one rank" for one)."""
        ranks = [str(r) for r in sorted(ranks)]
        if total and len(ranks) == total:
            return "every rank"
        if self.hidden:
            return "one rank" if len(ranks) == 1 else name
        return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(ranks[:-1])} and {ranks[-1]}"
