"""One grade per student, everywhere: the grade as the LMS shows it, and why it differs from the autograde.

A student reads their grade in the LMS (the import file's cell) and in the feedback it carries
(the feedback file, Moodle's comment, Blackboard's Feedback to Learner). Both come from here:
`cell` is the one rendering of a final grade on the LMS's scale (the import writes it, the feedback
quotes it), and `Statement` lists each step from the autograde to that grade (an override, the
late penalty, late days used, a grade of 0 past the last day), in words, with its points:

    Grade: 20.00 / 25 (Canvas; 80 / 100 on the autograder's scale)
      autograde                                                      100
      handed in 2026-04-16 10:00 +0200, 2 started day(s) late ...   -20
      final                                                           80

Scaling: final x points_possible / the rubric's maximum, two decimals (the rubric's own rounding,
grader.worth.rounded, is not redone: this only formats). With no points possible (no LMS file, or
none in it) the grade is shown on the rubric's scale.
"""

import html
from dataclasses import dataclass, field

from grader.lmss import LMSS
from grader.names import inert, plain


def number(value) -> str:
    """A number as a person reads it: at most 2 decimals, no trailing zeros."""
    return f"{value:.2f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def cell(final: float, max_score: float, points_possible=None) -> str:
    """The final grade as the LMS's import takes it: scaled to `points_possible`, two decimals."""
    scaled = final * points_possible / max_score if points_possible and max_score else final
    return f"{scaled:.2f}"


@dataclass
class Statement:
    """A student's grade as one LMS shows it, and each reason it is not the autograde."""
    lms: str                     # its name (grader.lmss); "" when no LMS file was filled: the rubric's scale
    shown: str = ""              # the LMS's cell ("20.00"); "" when there is no grade yet
    out_of: str = ""             # the LMS's points possible ("25"), or the rubric's maximum
    final: float = None          # on the rubric's scale
    max_score: float = 0.0
    autograde: float = None
    steps: list = field(default_factory=list)   # [why, points]
    pending: str = ""            # why there is no grade yet

    @property
    def scaled(self) -> bool:
        return self.out_of != number(self.max_score)

    def headline(self) -> str:
        if self.final is None:
            return f"No grade yet: {self.pending}"
        said = [LMSS[self.lms].shown_as] if self.lms else []
        if self.scaled:
            said.append(f"{number(self.final)} / {number(self.max_score)} on the autograder's scale")
        return f"Grade: {self.shown} / {self.out_of}" + (f" ({'; '.join(said)})" if said else "")

    def lines(self) -> list:
        """(why, points) rows from the autograde to the final grade, on the rubric's scale."""
        if self.final is None:
            return []
        return ([("autograde (the re-run and the log, as the report below scores them)", number(self.autograde))]
                + [(why, f"{points:+.2f}".rstrip("0").rstrip(".")) for why, points in self.steps]
                + [("final", number(self.final))])


def statement(row, max_score: float, lms: str = "", points_possible=None) -> Statement:
    """The Statement of a final gradebook row (grader.grades.book.Row) for `lms`, whose import scales
    to `points_possible` (None: the rubric's scale)."""
    out_of = number(float(points_possible)) if points_possible else number(max_score)
    s = Statement(lms=lms, out_of=out_of, final=row.final, max_score=max_score, autograde=row.autograde,
                  steps=[list(step) for step in row.changes])
    if row.final is None:
        s.pending = "; ".join(row.notes) or ", ".join(row.flags) or "not graded"
        return s
    s.shown = cell(row.final, max_score, points_possible)
    if row.autograde is None:   # a roster student with no hand-in
        s.autograde, s.steps = 0.0, [["no hand-in was graded", 0.0]] + s.steps
    return s


def markdown(s: Statement) -> str:
    """The statement on top of a feedback file (Markdown, every word inert)."""
    lines = [f"## {inert(s.headline())}", ""]
    if s.final is not None:
        lines += ["| | points |", "| --- | --- |"] + [f"| {inert(why)} | {points} |" for why, points in s.lines()]
        lines += ["", "The autograder's report below scores your code alone: the steps above come after it.", ""]
    return "\n".join(lines) + "\n"


def text(s: Statement) -> str:
    """The statement on one line (Moodle's feedback comment, a CSV cell)."""
    if s.final is None:
        return plain(s.headline())
    steps = "; ".join(f"{why}: {points}" for why, points in s.lines()[1:-1])
    return plain(f"{s.headline()}. Autograde {number(s.autograde)}" + (f"; {steps}" if steps else "") + ".")


def as_html(s: Statement, extra: list = ()) -> str:
    """The statement as HTML (Blackboard's Feedback to Learner), escaped; `extra`: lines after it."""
    rows = "".join(f"<li>{html.escape(plain(why))}: {html.escape(points)}</li>" for why, points in s.lines())
    more = "".join(f"<li>{html.escape(plain(line))}</li>" for line in extra)
    return (f"<p><strong>{html.escape(plain(s.headline()))}</strong></p>" + (f"<ul>{rows}</ul>" if rows else "")
            + (f"<ul>{more}</ul>" if more else ""))
