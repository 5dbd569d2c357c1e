"""Every LMS the kit reads and writes back, one record each (`Lms`), by name in `LMSS`.

An LMS meets the kit twice. Its bulk download comes in: intake recognises it (its students' file
names, `names`, or a file only its downloads hold, `marker`) and its `reader` says whose each file
is. Its grade file goes back: gradebook's `filler` fills the file the TA exported from it (`--lms
NAME:FILE`), `times` reads the submission times that file carries, and the feedback goes back as the
LMS takes it (a zip of files, or a column of the import). What the kit says to people about it
comes from here too: the command line's choices and help, the grade statement ("as Canvas shows
it"), the sentence gradebook prints beside each file it wrote.

The record names its functions as "module:function" (as grader.cli.COMMANDS does), loaded only by
the room that calls them: intake the reader, grades the filler and the times. So this module, like
every shared one, imports no room and no torch, and the command line lists the LMSs without
loading either. Adding an LMS is a record in `LMSS` (docs/engine.md, "Adding things").
"""

import importlib
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Lms:
    """One LMS: how its download names its students, who reads it, who fills its grade file, and
    what the kit says of it."""
    name: str                    # what `--lms` says, and each hand-in's download.json: "canvas"
    title: str                   # how people are shown it: "Canvas"
    reader: str                  # "module:function", (Listing, Lms) -> grader.intake.download.Shape
    filler: str                  # "module:function", (path, Book, assignment=, feedback=) -> (bytes, Filled)
    export: str                  # the file `gradebook --lms NAME:FILE` fills, as the help names it
    grades_go: str               # what the TA does with the import gradebook wrote, one sentence
    names: str = ""              # regex of the start of a student's file or folder name at the download's
                                 # top: (?P<id>), (?P<late>) the LMS's late marker; a student_id_pattern
    rest: str = ""               # regex of the rest of that name: (?P<orig>), the file's name as uploaded
    marker: str = ""             # a file name only this LMS's downloads hold (then `names` may be "")
    times: str = ""              # "module:function", (path, zone) -> [Submission]: times its grade file carries
    shown: str = ""              # where the student reads the grade (default "as TITLE shows it")
    per_assignment: bool = False # its grade file has a column per assignment: `--assignment` picks one
    feedback_goes: str = ""      # what the TA does with NAME-feedback.zip, one sentence ("": no zip)
    feedback_flat: bool = False  # the zip's files are UPLOAD_assignment4-feedback.md at its top, not in folders
    feedback_column: str = ""    # the import's column that takes the feedback instead of files

    @property
    def shown_as(self) -> str:
        return self.shown or f"as {self.title} shows it"

    def match(self, name: str):
        """The match of `names` and `rest` on a whole name at the download's top, or None (always,
        with no `names`)."""
        return re.match(self.names + self.rest, name) if self.names else None

    def read(self, listing):
        """The students of `listing`, a download of this LMS (grader.intake.download.Shape)."""
        return load(self.reader)(listing, self)

    def fill(self, path, book, **keys) -> tuple:
        """(the import's bytes, Filled) of the grade file `path` with `book`'s final grades."""
        return load(self.filler)(path, book, **keys)


def load(ref: str):
    """The function "module:function" names."""
    module, _, function = ref.partition(":")
    return getattr(importlib.import_module(module), function)


_INTAKE = "grader.intake.download"
LMSS = {lms.name: lms for lms in (
    Lms("canvas", "Canvas", f"{_INTAKE}:read_canvas", "grader.grades.lms.canvas:fill_canvas", "EXPORT.csv",
        "import it in Canvas: Grades > Import", per_assignment=True, feedback_flat=True,
        names=r"^(?P<login>[^_/]+)_(?:(?P<late>LATE)_)?(?P<id>\d+)_(?P<submission>\d+)_", rest=r"(?P<orig>.+)$",
        feedback_goes="upload it in Canvas: Assignments > Re-Upload Submissions (each file becomes a comment)"),
    Lms("moodle", "Moodle", f"{_INTAKE}:read_moodle", "grader.grades.lms.moodle:fill_moodle", "WORKSHEET.csv",
        "upload it in Moodle: Grading action > Upload grading worksheet",
        names=r"^(?P<name>[^/]+?)_(?P<id>\d+)_assign(?:submission|feedback)_",
        rest=r"(?P<plugin>[a-z]+)(?:_(?P<orig>.*))?$",
        times="grader.grades.lms.moodle:read_moodle_times",
        feedback_goes="upload it in Moodle: Grading action > Upload multiple feedback files in a zip"),
    Lms("blackboard", "Blackboard", "grader.intake.attempts:read_blackboard", "grader.grades.lms.blackboard:fill_blackboard",
        "GRADE_CENTER.csv (or .xls)", "upload it in Blackboard: Grade Center > Work Offline > Upload (its Feedback to "
        "Learner column carries the feedback)", per_assignment=True, feedback_column="Feedback to Learner",
        # The first "_attempt_<date>" is Blackboard's (the file's own name comes after it): neither the
        # assignment nor the username runs past it. Where the assignment ends the reader decides, once
        # for the whole download (grader.intake.attempts).
        names=r"^(?P<assignment>(?:(?!_attempt_\d{4}-)[^/])+?)_(?P<id>(?:(?!_attempt_\d{4}-)[^/])+)"
              r"_attempt_(?P<date>\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d)",
        rest=r"(?:_(?P<orig>.+)|(?P<txt>\.txt))$"),
    Lms("gradescope", "Gradescope", f"{_INTAKE}:read_gradescope", "grader.grades.lms.gradescope:fill_gradescope",
        "GRADES.csv", "Gradescope imports no grade file: keep it wherever the course keeps its grades",
        marker="submission_metadata.yml", times="grader.grades.lms.gradescope:read_gradescope_times",
        # Gradescope takes no import: its grade export goes to the course's gradebook.
        shown="as the course's grades from Gradescope's export give it",
        feedback_goes="Gradescope takes no feedback upload: hand it out yourselves, a folder per submission "
                      "(Gradescope's own page shows the autograder's results)"),
)}


def titles() -> str:
    """The LMSs as people read them: "Canvas, Moodle, Blackboard, Gradescope"."""
    return ", ".join(lms.title for lms in LMSS.values())


def specs() -> str:
    """What `gradebook --lms` takes: "canvas:EXPORT.csv, ... or gradescope:GRADES.csv"."""
    said = [f"{lms.name}:{lms.export}" for lms in LMSS.values()]
    return ", ".join(said[:-1]) + " or " + said[-1] if len(said) > 1 else "".join(said)


def id_regex(pattern: str) -> str:
    """`files.student_id_pattern` as a regex: an LMS's `names` when it is the LMS's name (a preset:
    `moodle` takes 12345 of "Jane Doe_12345_assignsubmission_file_hw4.zip", `canvas` also the LATE of
    "doejane_LATE_12345_67890_hw4.zip"), else the pattern itself."""
    lms = LMSS.get(pattern)
    return lms.names if lms is not None and lms.names else pattern
