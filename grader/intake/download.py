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
  `submission_metadata.yml` (that one, at its top) and a folder `submission_M/` per submission; the
  metadata maps `submission_M` to `:submitters:` (`:name:`, `:sid:`, `:email:`) and `:created_at:`,
  the time. The id is the first submitter's sid, else email; the others of a group are kept.
- **Blackboard** (Grade Center > Assignment File Download): per attempt, files
  `Assignment_user_attempt_YYYY-MM-DD-HH-MM-SS_ORIG` and one `Assignment_user_attempt_DATE.txt`
  (`Name: First Last (user)`, ...). `DATE` and `user` are the name's first `_attempt_<date>` and
  what precedes it after `Assignment`, one for the whole download (the receipts' or, read one way
  only, the names' common start); a name that does not fit, or whose receipt names another user, is
  a `Stray` (grader.intake.attempts reads them). DATE is the submission time (the server's zone);
  the latest attempt counts (`latest_attempt`).
- **A plain folder of hand-ins**: each zip, and each folder holding assignment4.py, is one
  hand-in, its id from its name by `files.student_id_pattern`.

Each LMS's patterns (`names`, `marker`) and reader are its record in grader.lmss, which the
readers here (`read_canvas` ...) are named by; a download of a file or a folder per student, named
by a pattern alone, needs no reader of its own (`read_named`). The LMS is recognised from the
names (its `marker` file at the top, else the one whose pattern most top-level names match), or named
(`grade --lms`). A file that fits no student is a `Stray`: said, never graded as anybody. A download
lists at most MAX_FILES files; a member over MAX_MEMBER_BYTES is that student's refusal, named.
"""

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath

from grader.intake.listing import MAX_MEMBER_BYTES, BlobError, DownloadError, Listing, files_digest
from grader.lmss import LMSS, Lms

GRADESCOPE_FOLDER = re.compile(r"^submission_\d+$")
RESUBMITTED = re.compile(r"^(?P<stem>.+)-(?P<n>\d{1,9})(?P<ext>\.[^.]+)$")   # Canvas's "assignment4-1.py"
CODE_NAMES = ("assignment4.py", "utils.py")

@dataclass
class Entry:
    """One student's hand-in as the download holds it: where its files are, never their bytes."""
    student: str               # the id from the LMS's names (not yet made safe as a folder name)
    name: str                  # where it is, e.g. "download.zip › Jane Doe_12345_assignsubmission_file_"
    lms: str                   # the LMS's name (grader.lmss.LMSS)
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
    lms: str                   # the LMS's name (grader.lmss.LMSS), or "" when the names are no LMS's
    entries: list = field(default_factory=list)   # Entry
    strays: list = field(default_factory=list)    # Stray


def _orig(name: str) -> str:
    """A Canvas file name without its resubmission suffix, when it is one of the code's names."""
    match = RESUBMITTED.match(name)
    return match["stem"] + match["ext"] if match and match["stem"] + match["ext"] in CODE_NAMES else name


def _resubmission(rel: str) -> tuple:
    """Canvas's files in upload order: "assignment4.py" before "assignment4-1.py" before "-2"."""
    match = RESUBMITTED.match(rel)
    return (int(match["n"]) if match and match["stem"].rsplit("_", 1)[-1] + match["ext"] in CODE_NAMES else 0, rel)


def add_file(entry: Entry, name: str, listing: Listing, rel: str, notes: list) -> None:
    """File `rel` of the listing as `name` of the student's hand-in (a second of one name: a Stray in `notes`)."""
    if name in entry.files:
        notes.append(Stray(listing.where(rel), f"{listing.where(rel)}: a second file named {name} for "
                           f"{entry.student}; kept this one, left out {entry.where[name]}"))
    try:
        entry.files[name], entry.where[name] = listing.blob(rel), listing.where(rel)
    except DownloadError as e:
        entry.error = entry.error or str(e)


def read_canvas(listing: Listing, lms: Lms) -> Shape:
    shape, entries = Shape(lms.name), {}
    for rel in sorted(listing.paths, key=_resubmission):   # a later upload ("-2") replaces an earlier
        match = lms.match(rel) if "/" not in rel else None
        if not match:
            shape.strays.append(Stray(listing.where(rel), f"{listing.where(rel)}: not named as {lms.title} names a "
                                      f"student's file (login_userid_submissionid_name); not graded"))
            continue
        prefix = f"{match['login']}_{'LATE_' if match['late'] else ''}{match['id']}_{match['submission']}"
        entry = entries.setdefault(match["id"], Entry(match["id"], listing.where(prefix), lms.name, upload=prefix,
                                                      late=bool(match["late"])))
        name = _orig(match["orig"])
        if name != match["orig"]:
            entry.files.pop(name, None)   # Canvas renamed an upload of the same name: the later one counts
        add_file(entry, name, listing, rel, shape.strays)
    shape.entries = list(entries.values())
    return shape


def read_moodle(listing: Listing, lms: Lms) -> Shape:
    shape, entries = Shape(lms.name), {}
    for rel in listing.paths:
        top = rel.split("/")[0]
        match = lms.match(top)
        inside = rel[len(top) + 1:] if "/" in rel else ""
        if not match or bool(inside) == bool(match["orig"]):   # a file in a student's folder, or a flat file
            shape.strays.append(Stray(listing.where(rel), f"{listing.where(rel)}: not named as {lms.title} names a "
                                      f"student's file (Full Name_id_assignsubmission_file_...); not graded"))
            continue
        folder = f"{match['name']}_{match['id']}_assignsubmission_file_"
        entry = entries.setdefault(match["id"], Entry(match["id"], listing.where(folder), lms.name, upload=folder))
        add_file(entry, inside or match["orig"], listing, rel, shape.strays)
    shape.entries = list(entries.values())
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


def read_gradescope(listing: Listing, lms: Lms) -> Shape:
    shape = Shape(lms.name)
    meta = lms.marker   # at the export's top (read_shape checked it is there), never a submission's own
    known = _gradescope_metadata(listing.read(meta).decode("utf-8", "replace"), listing.where(meta))
    entries = {}
    for rel in listing.paths:
        if rel == meta:
            continue
        parts = PurePosixPath(rel).parts
        if len(parts) < 2 or not GRADESCOPE_FOLDER.match(parts[0]):
            shape.strays.append(Stray(listing.where(rel), f"{listing.where(rel)}: not in a submission_N folder of "
                                      f"the export; not graded"))
            continue
        folder = parts[0]
        if folder not in entries:
            ids, when = known.get(folder, ([], ""))
            entries[folder] = Entry(ids[0] if ids else folder, listing.where(folder), lms.name,
                                    upload=folder, submitted_at=when, also=ids[1:])
            if not ids:
                shape.strays.append(Stray(listing.where(folder), f"{listing.where(folder)}: not in "
                                          f"{lms.marker} (or no sid or email): graded under the folder's name"))
        add_file(entries[folder], "/".join(parts[1:]), listing, rel, shape.strays)
    shape.entries = list(entries.values())
    return shape


def _marked(listing: Listing, lms: Lms) -> bool:
    """Whether `lms`'s marker is at the listing's top (read_shape took off a wrapping folder); deeper, a student's."""
    return bool(lms.marker) and lms.marker in listing.paths


def recognise(listing: Listing, lms: str = None) -> str:
    """The LMS of the listing's top-level names (or `lms`); "" for none, and where the code is at the top (one hand-in)."""
    if lms or "assignment4.py" in listing.paths:
        return lms or ""
    marked = [one.name for one in LMSS.values() if _marked(listing, one)]
    if marked:
        return marked[0]
    tops = {rel.split("/")[0] for rel in listing.paths}
    counts = {one.name: sum(bool(one.match(top)) for top in tops) for one in LMSS.values()}
    # Moodle's names match Canvas's pattern never, Blackboard's only with "_attempt_": the most wins,
    # and of a tie the LMS registered first.
    best = max(counts, key=counts.get)
    return best if counts[best] else ""


def read_shape(listing: Listing, lms: str = None) -> Shape:
    """The students of a download whose LMS is `lms` or recognised from its names."""
    tops = {rel.split("/")[0] for rel in listing.paths}
    if len(tops) == 1 and not any(one.match(next(iter(tops))) for one in LMSS.values()):
        listing = listing.stripped()   # a download unzipped into a folder of its own; never a student's folder
    found = LMSS.get(recognise(listing, lms))
    if found is not None and found.marker and not _marked(listing, found):
        raise DownloadError(f"{listing.label}: --lms {found.name}, but no {found.marker} in it; give the "
                            f"export's folder or zip as {found.title} made it")
    shape = found.read(listing) if found is not None else Shape("")
    for entry in shape.entries:
        _seal(entry, listing)
    return shape


def read_named(listing: Listing, lms: Lms) -> Shape:
    """A download whose every top-level file or folder is one student's, named by the LMS's `names`
    and `rest`: a file (`orig`, its name as uploaded, not empty) is that file of the student's
    hand-in; a folder (no `orig`) holds their files. The upload name is the name before `orig`, or
    the folder's."""
    shape, entries = Shape(lms.name), {}
    for rel in listing.paths:
        top = rel.split("/")[0]
        match = lms.match(top)
        inside = rel[len(top) + 1:] if "/" in rel else ""
        orig = (match.groupdict().get("orig") or "") if match else ""
        if not match or bool(inside) == bool(orig):
            shape.strays.append(Stray(listing.where(rel), f"{listing.where(rel)}: not named as {lms.title} names "
                                      f"a student's file; not graded"))
            continue
        upload = top[:match.start("orig")] if orig else top
        entry = entries.setdefault(match["id"], Entry(match["id"], listing.where(upload), lms.name, upload=upload,
                                                      late=bool(match.groupdict().get("late"))))
        add_file(entry, inside or orig, listing, rel, shape.strays)
    shape.entries = list(entries.values())
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
