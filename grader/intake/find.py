"""From the PATHs a TA gives `grade` to hand-ins: which are downloads, which are hand-ins.

A PATH may be an LMS download, zipped or unzipped (its students told apart by the LMS's names:
grader.intake.download), a plain folder of hand-ins (zips, or folders holding assignment4.py),
such a folder zipped, or one hand-in (a zip, or its unpacked folder). A download is expanded at the
level the TA gave only: a hand-in inside it is never taken for a download (a zip holding zips is
one student's, refused when unpacked: grader.intake.handin).

`find_handins` tells four things apart: hand-ins, hand-ins that cannot be read (a broken zip: the
student must hand in again), files of a download that fit no student (`strays`: for a person to
look at, never graded as anybody), and paths that are not hand-ins at all (a typo, an empty folder:
the TA's mistake, never graded as a student).
"""

import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from grader.intake import download
from grader.intake.handin import Handin, student_id
from grader.intake.listing import folder_digest
from grader.intake.listing import JUNK, MAX_MEMBER_BYTES, Blob, BlobError, DownloadError, Listing, files_digest
from grader.lmss import LMSS
from grader.names import inside, lms_key


@dataclass
class Unreadable:
    """A hand-in found but not readable (a broken zip): graded `invalid`, never skipped."""
    name: str
    student: str
    sha256: str
    message: str


@dataclass
class Found:
    handins: list = field(default_factory=list)      # Handin
    unreadable: list = field(default_factory=list)   # Unreadable
    errors: list = field(default_factory=list)       # (path, "PATH: why it holds no hand-in"): nothing to grade
    strays: list = field(default_factory=list)       # grader.intake.download.Stray: fits no student
    shapes: list = field(default_factory=list)       # "PATH: what it was read as", for the console


def _is_handin_folder(path: Path) -> bool:
    """assignment4.py at its top, or inside its only folder (a hand-in unpacked with its folder)."""
    if (path / "assignment4.py").is_file():
        return True
    entries = [e for e in path.iterdir() if not JUNK.search(e.name)]
    return len(entries) == 1 and entries[0].is_dir() and (entries[0] / "assignment4.py").is_file()


def _holds_code(top: str, rels: list) -> bool:
    """Whether the folder `top` is a hand-in: assignment4.py at its top, or in its only folder."""
    return any(len(PurePosixPath(r).parts) in (2, 3) and PurePosixPath(r).name == "assignment4.py" for r in rels)


def discover(paths, pattern: str = r"(?P<id>.+)") -> tuple:
    """The hand-ins under `paths`, and the problems met finding them ([(name, message)])."""
    found = find_handins(paths, pattern)
    return found.handins, [(u.name, u.message) for u in found.unreadable] + \
        [(path.name, message) for path, message in found.errors]


def _add_zip(found: Found, name: str, blob: Blob, pattern: str, z=None) -> None:
    """One zip hand-in (`blob`: the zip on disk, or a member of one), read once now to check that it
    is a zip and take its sha256; its bytes are read again from disk when it is graded."""
    student = student_id(name, pattern)
    try:
        f, digest = blob.seekable(MAX_MEMBER_BYTES, z)
    except BlobError as e:
        found.unreadable.append(Unreadable(name, student, "", f"{name}: {e}"))
        return
    try:
        with f, zipfile.ZipFile(f) as opened:
            opened.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError):
        found.unreadable.append(Unreadable(name, student, digest, f"{name}: not a readable zip file; ask for the "
                                                                  f"hand-in again"))
        return
    found.handins.append(Handin(name=name, student=student, sha256=digest, zip_file=blob))


def _from_entry(entry) -> Handin:
    """The hand-in of one student of an LMS download: its one zip, or its loose files, where they are."""
    blob = entry.single_zip
    return Handin(name=next(iter(entry.where.values())) if blob is not None else entry.name,
                  student=lms_key(entry.student), sha256=entry.sha256, zip_file=blob,
                  files=None if blob is not None else entry.files, lms=entry.lms, upload=entry.upload,
                  submitted_at=entry.submitted_at, late=entry.late, also=entry.also)


def _add_download(found: Found, path: Path, shape) -> None:
    """The students of an LMS download: one hand-in each, a refusal for each one that cannot be read."""
    found.handins.extend(_from_entry(e) for e in shape.entries if not e.error)
    found.unreadable.extend(Unreadable(e.name, lms_key(e.student), "", e.error) for e in shape.entries if e.error)
    found.strays.extend(shape.strays)
    found.shapes.append(f"{path}: a {LMSS[shape.lms].title} download of {len(shape.entries)} hand-in(s)"
                        + (f", {len(shape.strays)} file(s) that fit no student" if shape.strays else ""))


def _add_plain(found: Found, path: Path, listing: Listing, zipped: bool, pattern: str) -> bool:
    """A plain folder of hand-ins (zipped when `zipped`): each zip, and each folder holding
    assignment4.py, one hand-in; False when it is one hand-in (the code at its top, or one zip or
    folder in a zip)."""
    tops = {}
    for rel in listing.paths:
        tops.setdefault(PurePosixPath(rel).parts[0], []).append(rel)
    zips = [t for t, rels in tops.items() if rels == [t] and t.lower().endswith(".zip")]
    folders = [t for t, rels in tops.items() if rels != [t] and _holds_code(t, rels)]
    if zipped and ("assignment4.py" in listing.paths or len(zips) + len(folders) < 2):
        return False
    for top in sorted(zips):
        name = inside(path.name, top) if zipped else top
        try:
            _add_zip(found, name, listing.blob(top), pattern, listing.z)
        except DownloadError as e:
            found.unreadable.append(Unreadable(name, student_id(name, pattern), "", str(e)))
    for top in sorted(folders):
        if not zipped:
            found.handins.append(Handin(name=top, student=student_id(top, pattern),
                                        sha256=folder_digest(path / top), folder=path / top))
            continue
        name, files = inside(path.name, top), {rel[len(top) + 1:]: listing.blobs[rel] for rel in tops[top]}
        try:
            digest = files_digest(files, listing.z, MAX_MEMBER_BYTES)
        except BlobError as e:
            found.unreadable.append(Unreadable(name, student_id(top, pattern), "", f"{name}/{e.name}: {e}"))
            continue
        found.handins.append(Handin(name=name, student=student_id(top, pattern), sha256=digest, files=files))
    rest = sorted(set(tops) - set(zips) - set(folders))
    found.strays.extend(download.Stray(listing.where(t), f"{listing.where(t)}: not a zip, nor a folder with "
                                       f"assignment4.py; not graded") for t in rest)
    if zips or folders:
        found.shapes.append(f"{path}: a folder of {len(zips) + len(folders)} hand-in(s)"
                            + (f", {len(rest)} file(s) that are none" if rest else ""))
    return bool(zips or folders)


def _expand(found: Found, path: Path, listing: Listing, pattern: str, lms: str, zipped: bool = False) -> bool:
    """Read `listing` (of the path the TA gave: a folder, or a zip when `zipped`) as a download of
    an LMS, else as a plain folder of hand-ins; False when it is one hand-in."""
    shape = download.read_shape(listing, lms)
    if shape.lms:
        _add_download(found, path, shape)
        return True
    return _add_plain(found, path, listing, zipped, pattern)


def _add_path(found: Found, path: Path, pattern: str, lms: str) -> None:
    """What the TA gave as `path`: a download or a folder of hand-ins (zipped or not), or one hand-in."""
    if not path.exists():
        found.errors.append((path, f"{path}: no such file or folder"))
    elif path.is_file() and path.suffix.lower() == ".zip":
        listing = Listing.of_zip(path)
        try:
            if listing is None or not _expand(found, path, listing, pattern, lms, zipped=True):
                _add_zip(found, path.name, Blob(path.absolute()), pattern)
        finally:
            if listing is not None:
                listing.close()
    elif path.is_dir() and _is_handin_folder(path):
        found.handins.append(Handin(name=path.name, student=student_id(path.name, pattern),
                                    sha256=folder_digest(path), folder=path))
    elif path.is_dir():
        if not _expand(found, path, Listing.of_folder(path), pattern, lms):
            found.errors.append((path, f"{path}: no hand-in in it (no .zip file, no folder with assignment4.py, "
                                       f"no LMS's names)"))
    else:
        found.errors.append((path, f"{path}: not a zip file or a folder of hand-ins"))


def find_handins(paths, pattern: str = r"(?P<id>.+)", lms: str = None) -> Found:
    """The hand-ins under `paths`, those that cannot be read, the files of a download that fit no
    student, and the paths that hold none. `lms` names the LMS of the downloads (else recognised).
    Nothing of a hand-in's bytes is kept: each is read again from disk when it is graded."""
    found = Found()
    for path in map(Path, paths):
        try:
            _add_path(found, path, pattern, lms)
        except DownloadError as e:
            found.errors.append((path, str(e)))
    return found
