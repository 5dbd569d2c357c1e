"""What a rank says of an exception its hand-in raised: the exception's line and a traceback of the
hand-in's own frames only (assignment4.py and utils.py, named by file name), and whether it is a
collective's failure (a peer gone, a timeout) rather than the part's own.

A NameError for a name that only the script's own statements bind (`W = single_step()` at the top
level, which a rank leaves out: grader.rerun.rank.source) names the line that binds it.
"""

import os
import sys
import traceback

import torch.distributed as dist

from grader.rerun.rank.source import left_out_binding
from grader.rerun.wire.protocol import OWN_FILES, ErrorInfo


def said(exc: BaseException, code_dir: str = "") -> ErrorInfo:
    """The exception and a traceback of the frames in the hand-in's files, named by file name only."""
    code_dir = code_dir or os.path.dirname(getattr(sys.modules.get("assignment4"), "__file__", "") or "")
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if os.path.basename(f.filename) in OWN_FILES and (not code_dir or os.path.dirname(f.filename) == code_dir)]
    for f in frames:
        f.filename = os.path.basename(f.filename)
    only = traceback.format_exception_only(type(exc), exc)
    line = left_out_binding(os.path.join(code_dir, OWN_FILES[0]), exc.name) \
        if isinstance(exc, NameError) and isinstance(getattr(exc, "name", None), str) and code_dir else 0
    if line:
        only[-1] = only[-1].rstrip("\n") + (f" ({OWN_FILES[0]} binds {exc.name} only at line {line}, in the script's own "
                                            f"statements, which the grader does not run: each part is called on its "
                                            f"own, after the file's imports, definitions and set-up)\n")
    lines = ["Traceback (most recent call last):\n"] + traceback.format_list(frames) if frames else []
    text = "".join(lines + only)
    if code_dir:
        text = text.replace(code_dir + os.sep, "")
    exception = only[-1].strip().replace(code_dir + os.sep, "") if code_dir else only[-1].strip()
    return ErrorInfo(exception=exception[:2000], traceback=text[-6000:])


def text_of(exc: BaseException) -> str:
    """str(exc), or "" where the hand-in's exception makes even that fail (its __str__ raises)."""
    try:
        return str(exc)
    except Exception:   # noqa: BLE001 - the hand-in's __str__ may raise anything
        return ""


def collective_failed(exc: BaseException) -> bool:
    """Whether `exc` is a collective's failure: gloo's, a timeout, a connection a peer closed."""
    text = f"{type(exc).__name__} {text_of(exc)}".lower()
    return isinstance(exc, getattr(dist, "DistError", ())) or any(
        s in text for s in ("gloo", "timed out", "connection closed", "connection reset"))
