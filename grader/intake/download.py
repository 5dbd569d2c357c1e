"""LMS downloads: which student each file of a bulk download belongs to, by the LMS's own names.

A TA gives `grade` what the LMS gave them, zipped or unzipped. The download is expanded at that
level only: each student's part becomes one hand-in (`Entry`), and nothing inside a student's
hand-in is ever taken for a download (grader.intake.handin opens at most one zip nested in it).
The LMSs name their downloads so (`ORIG` is the file's name as the student uploaded it):

- **Canvas** (Assignments > Download Submissions): one file per uploaded file, at the top,
  `login_[LATE_]userid_submissionid_ORIG`: `login` is the student's sortable name in lower case
  without spaces or punctuation, `LATE` marks a submission after the due date, `userid` is the id
  (the gradebook export's `ID`). A file uploaded again under the same name gets `-1`, `-2` before
  its extension (`assignment4-1.py`); the suffix is taken off the code's names. A student who
  uploaded a zip gives one file (`..._handin.zip`); loose files of one student are grouped into one
  hand-in under their original names. "Late submissions only" gives the same names.
- **Moodle** (View all submissions > Download all submissions): with "Download submissions in
  folders" (the default) a folder per student and plugin, `Full Name_id_assignsubmission_file_/ORIG`,
  else flat files `Full Name_id_assignsubmission_file_ORIG`; online text is
  `..._assignsubmission_onlinetext_/onlinetext.html`. Under blind marking `Full Name` is
  `Participant`. `id` is the participant id (the grading worksheet's `Participant 12345`).
- **Gradescope** (Review grades > Export submissions): a folder `assignment_N_export/` holding
  `submission_metadata.yml` and a folder `submission_M/` per submission; the metadata maps
  `submission_M` to `:submitters:` (each with `:name:`, `:sid:`, `:email:`) and `:created_at:`, the
  submission time. The id is the first submitter's sid, else email; the others of a group are kept.
- **Blackboard** (Grade Center > Assignment File Download): per attempt, files
  `Assignment_user_attempt_YYYY-MM-DD-HH-MM-SS_ORIG` and one `Assignment_user_attempt_DATE.txt`
  (name, date submitted, the list of files); the attempt's date is its submission time (in the
  server's zone, which the name does not carry). Several attempts of one student are several
  hand-ins; the latest counts (`latest_attempt`), and the earlier ones are no duplicate.
- **A plain folder of hand-ins**: each zip, and each folder holding assignment4.py, is one
  hand-in, its id from its name by `files.student_id_pattern`.

The LMS is recognised from the names (the one whose pattern most top-level names match), or named
(`grade --lms`). A file that fits no student is a `Stray`: said, never graded as anybody. A download
lists at most MAX_FILES files; a member over MAX_MEMBER_BYTES is that student's refusal, named.
"""

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath

from grader.intake.listing import MAX_MEMBER_BYTES, BlobError, DownloadError, Listing, files_digest

CANVAS = re.compile(r"^(?P<login>[^_/]+)_(?:(?P<late>LATE)_)?(?P<id>\d+)_(?P<submission>\d+)_(?P<orig>.+)$")
MOODLE = re.compile(r"^(?P<name>[^/]+?)_(?P<id>\d+)_assign(?:submission|feedback)_(?P<plugin>[a-z]+)(?:_(?P<orig>.*))?$")
BLACKBOARD = re.compile(r"^(?P<assignment>[^/]+)_(?P<id>[^_/]+)_attempt_"
                        r"(?P<date>\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d)(?:_(?P<orig>.+)|(?P<txt>\.txt))$")
GRADESCOPE_META = "submission_metadata.yml"
GRADESCOPE_FOLDER = re.compile(r"^submission_\d+$")
RESUBMITTED = re.compile(r"^(?P<stem>.+)-(?P<n>\d+)(?P<ext>\.[^.]+)$")   # Canvas's "assignment4-1.py"
CODE_NAMES = ("assignment4.py", "utils.py")

@dataclass
class Entry:
    """One student's hand-in as the download holds it: where its files are, never their bytes."""
    student: str               # the id from the LMS's names (not yet made safe as a folder name)
    name: str                  # where it is, e.g. "download.zip › Jane Doe_12345_assignsubmission_file_"
    lms: str                   # canvas, moodle, gradescope or blackboard
    files: dict = field(default_factory=dict)   # its file names (as uploaded) -> grader.intake.listing.Blob
    where: dict = field(default_factory=dict)   # its file names -> where each is in the download
    upload: str = ""           # the download's name for the student, for feedback (Moodle's folder, Canvas's prefix)
    submitted_at: str = ""     # ISO 8601 as the download says it ("" when it does not; maybe without a zone)
    late: bool = False         # Canvas's LATE marker
    also: list = field(default_factory=list)    # the other students of a group hand-in (Gradescope)
    error: str = ""            # why a file of it could not be read (then it is graded invalid)
    sha256: str = ""           # of its one zip, else of its files (grader.intake.listing.files_digest)

    @property
    def single_zip(self):
        """The Blob of the student's one zip, when that is all they handed in."""
        names = list(self.files)
        return self.files[names[0]] if len(names) == 1 and names[0].lower().endswith(".zip") else None


@dataclass
class Stray:
    name: str                  # a file or folder of a download that fits no student
    message: str


@dataclass
class Shape:
    lms: str                   # canvas, moodle, gradescope or blackboard, or "" when the names are no LMS's
    entries: list = field(default_factory=list)   # Entry
    strays: list = field(default_factory=list)    # Stray


def _orig(name: str) -> str:
    """A Canvas file name without its resubmission suffix, when it is one of the code's names."""
    match = RESUBMITTED.match(name)
    if match and match["stem"] + match["ext"] in CODE_NAMES:
        return match["stem"] + match["ext"]
    return name


def _resubmission(rel: str) -> tuple:
    """Canvas's files in upload order: "assignment4.py" before "assignment4-1.py" before "-2"."""
    match = RESUBMITTED.match(rel)
    return (int(match["n"]) if match and match["stem"].rsplit("_", 1)[-1] + match["ext"] in CODE_NAMES else 0, rel)


def _add(entry: Entry, name: str, listing: Listing, rel: str, notes: list) -> None:
    if name in entry.files:
        notes.append(Stray(listing.where(rel), f"{listing.where(rel)}: a second file named {name} for "
                           f"{entry.student}; kept this one, left out {entry.where[name]}"))
    try:
        entry.files[name], entry.where[name] = listing.blob(rel), listing.where(rel)
    except DownloadError as e:
        entry.error = entry.error or str(e)


def _canvas(listing: Listing) -> Shape:
    shape, entries = Shape("canvas"), {}
    for rel in sorted(listing.paths, key=_resubmission):   # a later upload ("-2") replaces an earlier
        match = CANVAS.match(rel) if "/" not in rel else None
        if not match:
            shape.strays.append(Stray(listing.where(rel), f"{listing.where(rel)}: not named as Canvas names a "
                                      f"student's file (login_userid_submissionid_name); not graded"))
            continue
        prefix = f"{match['login']}_{'LATE_' if match['late'] else ''}{match['id']}_{match['submission']}"
        entry = entries.setdefault(match["id"], Entry(match["id"], listing.where(prefix), "canvas", upload=prefix,
                                                      late=bool(match["late"])))
        name = _orig(match["orig"])
        if name != match["orig"]:
            entry.files.pop(name, None)   # Canvas renamed an upload of the same name: the later one counts
        _add(entry, name, listing, rel, shape.strays)
    shape.entries = list(entries.values())
    return shape


def _moodle(listing: Listing) -> Shape:
    shape, entries = Shape("moodle"), {}
    for rel in listing.paths:
        top = rel.split("/")[0]
        match = MOODLE.match(top)
        inside = rel[len(top) + 1:] if "/" in rel else ""
        if not match or bool(inside) == bool(match["orig"]):   # a file in a student's folder, or a flat file
            shape.strays.append(Stray(listing.where(rel), f"{listing.where(rel)}: not named as Moodle names a "
                                      f"student's file (Full Name_id_assignsubmission_file_...); not graded"))
            continue
        folder = f"{match['name']}_{match['id']}_assignsubmission_file_"
        entry = entries.setdefault(match["id"], Entry(match["id"], listing.where(folder), "moodle", upload=folder))
        _add(entry, inside or match["orig"], listing, rel, shape.strays)
    shape.entries = list(entries.values())
    return shape


def _blackboard(listing: Listing) -> Shape:
    shape, entries = Shape("blackboard"), {}
    for rel in listing.paths:
        match = BLACKBOARD.match(rel) if "/" not in rel else None
        if not match:
            shape.strays.append(Stray(listing.where(rel), f"{listing.where(rel)}: not named as Blackboard names "
                                      f"an attempt's file (Assignment_user_attempt_date_name); not graded"))
            continue
        date = match["date"]
        when = f"{date[:10]}T{date[11:].replace('-', ':')}"
        attempt = f"{match['assignment']}_{match['id']}_attempt_{date}"
        entry = entries.setdefault((match["id"], date), Entry(match["id"], listing.where(attempt), "blackboard",
                                                              upload=attempt, submitted_at=when))
        if not match["txt"]:
            _add(entry, match["orig"], listing, rel, shape.strays)
    shape.entries = [e for e in entries.values() if e.files]
    shape.strays += [Stray(e.name, f"{e.name}.txt: an attempt with no file; nothing to grade")
                     for e in entries.values() if not e.files]
    return shape


def _gradescope_metadata(text: str, where: str) -> dict:
    """submission folder -> (ids of its submitters, created_at) from submission_metadata.yml."""
    import yaml
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise DownloadError(f"{where}: not valid YAML ({e}); export the submissions again") from None
    found = {}
    for folder, item in (data or {}).items() if isinstance(data, dict) else ():
        if not isinstance(item, dict):
            continue
        item = {str(k).lstrip(":"): v for k, v in item.items()}
        users = [{str(k).lstrip(":"): v for k, v in u.items()} for u in item.get("submitters") or [] if isinstance(u, dict)]
        ids = [str(u.get("sid") or u.get("email") or "").strip() for u in users]
        found[str(folder)] = ([i for i in ids if i], str(item.get("created_at") or ""))
    return found


def _gradescope(listing: Listing) -> Shape:
    shape = Shape("gradescope")
    meta = next(rel for rel in listing.paths if PurePosixPath(rel).name == GRADESCOPE_META)
    base = str(PurePosixPath(meta).parent)
    base = "" if base == "." else base + "/"
    known = _gradescope_metadata(listing.read(meta).decode("utf-8", "replace"), listing.where(meta))
    entries = {}
    for rel in listing.paths:
        if rel == meta:
            continue
        parts = PurePosixPath(rel[len(base):]).parts if rel.startswith(base) else ()
        if len(parts) < 2 or not GRADESCOPE_FOLDER.match(parts[0]):
            shape.strays.append(Stray(listing.where(rel), f"{listing.where(rel)}: not in a submission_N folder of "
                                      f"the export; not graded"))
            continue
        folder = parts[0]
        if folder not in entries:
            ids, when = known.get(folder, ([], ""))
            entries[folder] = Entry(ids[0] if ids else folder, listing.where(base + folder), "gradescope",
                                    upload=folder, submitted_at=when, also=ids[1:])
            if not ids:
                shape.strays.append(Stray(listing.where(base + folder), f"{listing.where(base + folder)}: not in "
                                          f"{GRADESCOPE_META} (or no sid or email): graded under the folder's name"))
        _add(entries[folder], "/".join(parts[1:]), listing, rel, shape.strays)
    shape.entries = list(entries.values())
    return shape


MATCHERS = {"canvas": CANVAS.match, "moodle": MOODLE.match, "blackboard": BLACKBOARD.match}


def recognise(listing: Listing, lms: str = None) -> str:
    """The LMS whose names the listing's top-level names are, or "" for none."""
    if lms:
        return lms
    if any(PurePosixPath(rel).name == GRADESCOPE_META for rel in listing.paths):
        return "gradescope"
    tops = {rel.split("/")[0] for rel in listing.paths}
    counts = {name: sum(bool(match(top)) for top in tops) for name, match in MATCHERS.items()}
    # Moodle's names match Canvas's pattern never, Blackboard's only with "_attempt_": the most wins.
    best = max(counts, key=counts.get)
    return best if counts[best] else ""


def read_shape(listing: Listing, lms: str = None) -> Shape:
    """The students of a download whose LMS is `lms` or recognised from its names."""
    tops = {rel.split("/")[0] for rel in listing.paths}
    if len(tops) == 1 and not any(match(next(iter(tops))) for match in MATCHERS.values()):
        listing = listing.stripped()   # a download unzipped into a folder of its own; never a student's folder
    found = recognise(listing, lms)
    if found == "gradescope" and not any(PurePosixPath(r).name == GRADESCOPE_META for r in listing.paths):
        raise DownloadError(f"{listing.label}: --lms gradescope, but no {GRADESCOPE_META} in it; give the "
                            f"export's folder or zip as Gradescope made it")
    readers = {"canvas": _canvas, "moodle": _moodle, "blackboard": _blackboard, "gradescope": _gradescope}
    shape = readers[found](listing) if found else Shape("")
    for entry in shape.entries:
        _seal(entry, listing)
    return shape


def _seal(entry: Entry, listing: Listing) -> None:
    """The entry's sha256, its files read once as a stream (a damaged one is the student's refusal, named)."""
    if entry.error:
        return
    try:
        one = entry.single_zip
        entry.sha256 = one.digest(listing.z, MAX_MEMBER_BYTES) if one else \
            files_digest(entry.files, listing.z, MAX_MEMBER_BYTES)
    except BlobError as e:
        entry.error = f"{entry.where.get(e.name) or next(iter(entry.where.values()))}: {e}"



def latest_attempt(said: list):
    """Of several hand-ins of one student (what the download said of each: download.json), the index
    of the one that counts when they are the LMS's own attempts: all from one LMS's download, each
    with a submission time of its own (Blackboard's attempts); None when they are not (a real
    duplicate: two files of one student, or no time to order them by)."""
    lmss = {s.get("lms") or "" for s in said}
    times = [s.get("submitted_at") or "" for s in said]
    if len(said) < 2 or len(lmss) != 1 or "" in lmss or "" in times or len(set(times)) != len(times):
        return None
    try:
        parsed = [datetime.fromisoformat(t) for t in times]
        return parsed.index(max(parsed))
    except (TypeError, ValueError):   # mixed zones, or no time at all
        return None
