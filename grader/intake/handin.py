"""Hand-ins: unpack them safely, normalise them, and locate the four files.

A hand-in (grader.intake.find finds them) is a zip, an unpacked folder, or the loose files of
one student of an LMS download. Unpacking refuses absolute paths, `..`, symbolic links, names that
are not valid UTF-8, too many members and too many bytes (checked while extracting, not only as
declared), and writes nothing outside the hand-in's own folder. Junk is dropped (`__MACOSX/`,
`.DS_Store`, `__pycache__/`, `._*`), a single leading folder is stripped, and one zip nested in the
hand-in is opened (never a zip in that one; a hand-in of several zips and no code is refused,
naming the file). The code is found by name (`assignment4.py`, `utils.py`), the run's stdout and
stderr by what they hold, whatever their names (grader.evidence.runs: of several runs, the best of
the code handed in). An assignment4.py over the rubric's `files.max_code_kb` or
`files.max_code_lines` is refused before anything parses it (`check_code_size`).
"""

import hashlib
import io
import re
import stat
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from grader.evidence import runs as run_logs
from grader.intake.listing import CHUNK, JUNK, MAX_MEMBER_BYTES, Blob, BlobError, said, zip_entries
from grader.lmss import id_regex
from grader.names import inside, innermost, safe_id


class HandinError(ValueError):
    """A hand-in that cannot be graded as it is; the message names the file and what to do."""


@dataclass
class Handin:
    """One hand-in found on disk, not yet unpacked."""
    name: str          # file or folder name, e.g. "alice.zip" or "bulk.zip › alice.zip" (grader.names.inside)
    student: str
    sha256: str
    zip_bytes: bytes = None   # a zip's content, when it is not on disk (a student's own check); or
    zip_file: Blob = None     # a zip on disk, or a member of one (a download's), read when graded; or
    folder: Path = None       # an unpacked hand-in; or
    files: dict = None        # a hand-in of loose files in a download: name as uploaded -> Blob (or bytes)
    lms: str = ""             # the LMS whose download it came from ("" for none)
    upload: str = ""          # the download's name for the student (feedback goes back under it)
    submitted_at: str = ""    # as the download says it, "" when it does not
    late: bool = False        # Canvas's LATE marker
    also: list = field(default_factory=list)   # the other students of a group hand-in

    def intake(self) -> dict:
        """What the download said of this hand-in (OUT/students/<key>/download.json)."""
        return {"name": self.name, "student": self.student, "lms": self.lms, "upload": self.upload,
                "submitted_at": self.submitted_at, "late": self.late, "also": self.also,
                "files": sorted(self.files) if self.files else []}

    @contextmanager
    def opened_zip(self):
        """The zip as a seekable binary file, read now from where it is (never the whole download);
        HandinError if it cannot be read or changed since the hand-in was found."""
        if self.zip_bytes is not None:
            yield io.BytesIO(self.zip_bytes)
            return
        try:
            f, digest = self.zip_file.seekable(MAX_MEMBER_BYTES)
        except BlobError as e:
            raise HandinError(f"{self.name}: {e}; grade it again, or ask for the hand-in again") from None
        with f:
            if digest != self.sha256:
                raise HandinError(f"{self.name}: changed on disk while the batch ran; grade it again")
            yield f


@dataclass
class Unpacked:
    root: Path
    files: dict = field(default_factory=dict)   # role -> Path: "assignment", "utils", "log", "err"
    notes: list = field(default_factory=list)   # what normalising did, for feedback
    run: object = None                          # grader.evidence.runs.Run of the log, when there is one


def _stem(name: str) -> str:
    stem = innermost(name)
    return stem[:-4] if stem.lower().endswith(".zip") else stem


def id_match(name: str, pattern: str):
    """The match of `pattern` (a regex or an LMS preset) on a hand-in's name, or None."""
    match = re.search(id_regex(pattern), _stem(name))
    return match if match and match.group("id") else None


def student_id(name: str, pattern: str) -> str:
    """The id in a hand-in's name (for a zip in a bulk download, its path there) by `pattern`'s `id`
    group; a name that does not match keeps its whole name (summary.md lists those)."""
    match = id_match(name, pattern)
    return safe_id(match.group("id") if match else _stem(name))


MAX_DEPTH = 16   # the parts of a member's path: a hand-in's files sit a folder or two deep


def _safe_name(info: zipfile.ZipInfo, zip_name: str) -> str:
    raw = info.filename
    if not info.flag_bits & 0x800 and not raw.isascii():
        # Without the UTF-8 flag Python decoded the name as cp437; its bytes must still be UTF-8.
        try:
            raw = raw.encode("cp437").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            raise HandinError(f"{zip_name}: the member name {info.filename!r} is not valid UTF-8; "
                              f"re-create the zip with plain file names") from None
    if not raw.strip("/"):
        raise HandinError(f"{zip_name}: a member has no name; re-create the zip from the files themselves")
    if "\x00" in raw or "\\" in raw:
        raise HandinError(f"{zip_name}: the member name {raw!r} has characters a file name cannot have")
    path = PurePosixPath(raw)
    if path.is_absolute() or re.match(r"^[A-Za-z]:", raw):
        raise HandinError(f"{zip_name}: the member {raw!r} has an absolute path; zip the files, not their location")
    if ".." in path.parts:
        raise HandinError(f"{zip_name}: the member {raw!r} points outside the hand-in ('..'); refused")
    if len(path.parts) > MAX_DEPTH:   # a tree that deep costs whatever walks it a frame per folder
        raise HandinError(f"{zip_name}: a member is {len(path.parts) - 1} folders deep, more than the "
                          f"{MAX_DEPTH - 1} a hand-in may have; zip the files themselves")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise HandinError(f"{zip_name}: the member {raw!r} is a symbolic link; zip the files themselves")
    return raw



def _refuse_members(name: str, count: int, limits) -> None:
    if count > limits.max_members:
        raise HandinError(f"{name}: {count} members, more than the {limits.max_members} allowed; "
                          f"hand in only the four required files")


def extract_zip(data, dest: Path, zip_name: str, limits) -> list:
    """Extract a zip (bytes, or a seekable binary file) into `dest` within `limits` (rubric.files);
    return the notes on what was dropped."""
    max_member = int(limits.max_member_mb * (1 << 20))
    max_total = int(limits.max_total_mb * (1 << 20))
    _refuse_members(zip_name, zip_entries(data), limits)   # its end record's: parsing millions of entries costs GBs
    try:
        z = zipfile.ZipFile(io.BytesIO(data) if isinstance(data, bytes) else data)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise HandinError(f"{zip_name}: not a readable zip file ({said(e)}); ask for the hand-in again") from e
    infos = z.infolist()
    _refuse_members(zip_name, len(infos), limits)
    dropped, total = [], 0
    dest = dest.resolve()
    with z:
        for info in infos:
            name = _safe_name(info, zip_name)
            if JUNK.search(name):
                dropped.append(name)
                continue
            if info.is_dir():
                continue
            if info.file_size > max_member:
                raise HandinError(f"{zip_name}: {name} unpacks to {info.file_size} bytes, over the "
                                  f"{limits.max_member_mb:g} MB limit for one file")
            target = (dest / name).resolve()
            if dest not in target.parents:
                raise HandinError(f"{zip_name}: the member {name!r} would be written outside the hand-in; refused")
            written = 0
            try:
                target.parent.mkdir(parents=True, exist_ok=True)   # fails where a file has its name
                with z.open(info) as src, open(target, "wb") as out:
                    while chunk := src.read(CHUNK):
                        written += len(chunk)
                        total += len(chunk)
                        if written > max_member or total > max_total:
                            raise HandinError(f"{zip_name}: unpacks to more than the limits allow "
                                              f"({limits.max_member_mb:g} MB a file, {limits.max_total_mb:g} MB "
                                              f"in all): a zip bomb, or files that do not belong in it")
                        out.write(chunk)
            except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, OSError, EOFError, RuntimeError,
                    NotImplementedError) as e:
                raise HandinError(f"{zip_name}: {name} cannot be unpacked ({said(e)})") from e
    notes = []
    if dropped:
        shown = sorted({PurePosixPath(d).parts[0] if "__MACOSX" in d else PurePosixPath(d).name for d in dropped})
        notes.append(f"left out {len(dropped)} file(s) that do not belong in a hand-in: {', '.join(shown[:5])}")
    return notes


def write_files(files: dict, dest: Path, name: str, limits) -> None:
    """Write a hand-in given as loose files (name -> Blob or bytes) into `dest` within `limits`, each
    read as it is written; a name no file may have there refuses the hand-in, as in a zip."""
    _refuse_members(name, len(files), limits)
    total, dest = 0, dest.resolve()
    for member, data in sorted(files.items()):
        info = zipfile.ZipInfo(member)
        info.flag_bits |= 0x800
        member = _safe_name(info, name)
        if JUNK.search(member):
            continue
        target, written = (dest / member).resolve(), 0
        if dest not in target.parents:
            raise HandinError(f"{name}: the file {member!r} would be written outside the hand-in; refused")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)   # fails where a file has the folder's name
            with open(target, "wb") as out:
                for chunk in [data] if isinstance(data, bytes) else data.chunks():
                    written, total = written + len(chunk), total + len(chunk)
                    if written > limits.max_member_mb * (1 << 20) or total > limits.max_total_mb * (1 << 20):
                        raise HandinError(f"{name}: more than the limits allow ({limits.max_member_mb:g} MB a "
                                          f"file, {limits.max_total_mb:g} MB in all)")
                    out.write(chunk)
        except BlobError as e:
            raise HandinError(f"{name}: {member} {e}; grade it again, or ask for the hand-in again") from None
        except OSError as e:   # as in a zip: a name no file may have (both a file and a folder, over 255 bytes)
            raise HandinError(f"{name}: {member} cannot be written ({said(e)}; a file and a folder of one name, "
                              f"or a name over 255 bytes, cannot be); rename it and hand it in again") from None


def _strip_single_folder(root: Path) -> list:
    entries = [e for e in root.iterdir()]
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        name, children = entries[0].name, {c.name for c in entries[0].iterdir()}
        free = next(f".stripped{i}" for i in range(len(children) + 1) if f".stripped{i}" not in children)
        inner = entries[0].rename(root / free)   # "hw4/hw4/...": free the name its child moves to
        for child in list(inner.iterdir()):
            child.rename(root / child.name)
        inner.rmdir()
        return [f"the files were inside a folder '{name}/'; hand in the files themselves next time"]
    return []


def _pick(paths: list, role: str, notes: list):
    if not paths:
        return None
    paths = sorted(paths, key=lambda p: (len(p.parts), str(p)))
    if len(paths) > 1:
        notes.append(f"found {len(paths)} {role} files ({', '.join(p.name for p in paths[:4])}); used {paths[0].name}")
    return paths[0]


def locate(root: Path, notes: list, rule=None) -> tuple:
    """Find the hand-in's files under `root`: (role -> path, the run chosen or None)."""
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    found = {"assignment": _pick([p for p in files if p.name == "assignment4.py"], "assignment4.py", notes),
             "utils": _pick([p for p in files if p.name == "utils.py"], "utils.py", notes)}
    code = hashlib.sha256(found["assignment"].read_bytes()).hexdigest() if found["assignment"] else ""
    choice = run_logs.choose(files, code, rule)
    if choice.run is not None:
        found["log"], found["err"] = choice.run.log, choice.run.err
    else:   # no run's stdout: a stderr handed in is still the run's .err
        found["err"] = _pick([p for p in files if run_logs.is_stderr(p)], "stderr", notes)
    if choice.note:
        notes.append(choice.note)
    return {role: path for role, path in found.items() if path is not None}, choice.run


def unpack(handin: Handin, dest: Path, limits, rule=None) -> Unpacked:
    """Unpack (or copy) a hand-in into the empty folder `dest` and locate its files (`rule`: what the
    rubric asks of a run, grader.evidence.runs.LogRule, to choose among several)."""
    dest.mkdir(parents=True, exist_ok=True)
    notes = []
    if handin.zip_bytes is not None or handin.zip_file is not None:
        with handin.opened_zip() as data:
            notes += extract_zip(data, dest, handin.name, limits)
    elif handin.files is not None:
        write_files(handin.files, dest, handin.name, limits)
    else:
        total = 0
        for path in sorted(handin.folder.rglob("*")):
            rel = path.relative_to(handin.folder)
            if path.is_symlink() or JUNK.search(rel.as_posix()) or not path.is_file():
                continue
            total += path.stat().st_size
            if total > limits.max_total_mb * (1 << 20):
                raise HandinError(f"{handin.name}: more than {limits.max_total_mb:g} MB of files")
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(path.read_bytes())
    notes += _strip_single_folder(dest)
    inner = [p for p in dest.rglob("*.zip") if p.is_file()]
    if inner and not any(p.name == "assignment4.py" for p in dest.rglob("assignment4.py")):
        if len(inner) > 1:
            raise HandinError(f"{handin.name}: no assignment4.py, and {len(inner)} zips in it "
                              f"({', '.join(sorted(p.name for p in inner)[:4])}); a hand-in holds the files, "
                              f"or one zip of them: hand in one zip with assignment4.py in it")
        nested = inner[0]
        nested_dest = dest / "_nested"
        with open(nested, "rb") as data:
            notes += extract_zip(data, nested_dest, inside(handin.name, nested.name), limits)
        notes += _strip_single_folder(nested_dest)
        notes.append(f"the files were inside another zip, {nested.name}; hand in one zip next time")
    files, run = locate(dest, notes, rule)
    if "assignment" not in files:
        names = sorted(p.name for p in dest.rglob("*") if p.is_file())[:8]
        raise HandinError(f"{handin.name}: no assignment4.py in the hand-in (found: {', '.join(names) or 'nothing'}); "
                          f"hand in a zip with assignment4.py, utils.py and the run's log files")
    check_code_size(files["assignment"], handin.name, limits)
    return Unpacked(root=dest, files=files, notes=notes, run=run)


def check_code_size(path: Path, name: str, limits) -> None:
    """Refuse an assignment4.py above the rubric's caps (`files.max_code_kb`, `files.max_code_lines`;
    grader.limits says why) before anything parses it, its lines counted as Python counts them."""
    size = path.stat().st_size
    what = ("; hand in the assignment4.py you wrote, without generated code or pasted data (a solution "
            "is a few hundred lines), or ask the course staff")
    if size > limits.max_code_kb * 1024:
        raise HandinError(f"{name}: {path.name} is {size / 1024:,.0f} KB, over the {limits.max_code_kb:g} KB "
                          f"a hand-in's code may have (files.max_code_kb){what}")
    with open(path, "rb") as f:
        lines = len(f.read().splitlines())   # \n, \r\n and a lone \r, as Python's own tokenizer
    if lines > limits.max_code_lines:
        raise HandinError(f"{name}: {path.name} has {lines:,} lines, over the {limits.max_code_lines} a "
                          f"hand-in's code may have (files.max_code_lines){what}")
