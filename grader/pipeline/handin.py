"""Hand-ins: find them, unpack them safely, normalise them, and locate the four files.

A PATH given to the grader may be a hand-in zip, a folder of zips, a zip of zips (an LMS bulk
download) or an unpacked hand-in folder. Unpacking refuses absolute paths, `..`, symbolic links,
names that are not valid UTF-8, too many members and too many bytes (checked while extracting,
not only as declared), and writes nothing outside the hand-in's own folder. Junk is dropped
(`__MACOSX/`, `.DS_Store`, `__pycache__/`, `._*`), a single leading folder is stripped, and one
nested zip is opened. The code is found by name (`assignment4.py`, `utils.py`); the run's stdout
and stderr by what they hold, whatever their names (grader.pipeline.runs: of several runs, the best
of the code handed in).

`find_handins` tells three things apart: hand-ins, hand-ins that cannot be read (a broken zip: the
student must hand in again), and paths that are not hand-ins at all (a typo, an empty folder: the
TA's mistake, never graded as a student).
"""

import hashlib
import io
import re
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from grader.pipeline import runs as run_logs
from grader.rubric import id_regex

JUNK = re.compile(r"(^|/)(__MACOSX|__pycache__|\.git|\.ipynb_checkpoints)(/|$)|(^|/)(\.DS_Store|\._[^/]*|Thumbs\.db)$")
CHUNK = 1 << 16


class HandinError(ValueError):
    """A hand-in that cannot be graded as it is; the message names the file and what to do."""


@dataclass
class Handin:
    """One hand-in found on disk, not yet unpacked."""
    name: str          # file or folder name, e.g. "alice.zip" or "bulk.zip!alice.zip"
    student: str
    sha256: str
    zip_bytes: bytes = None   # a zip's content, when it is not on disk (a student's own check); or
    zip_path: Path = None     # a zip on disk, read when graded (a batch holds no hand-in's bytes),
    members: tuple = ()       # and the zip's path inside it (a bulk download's member), outermost first
    folder: Path = None       # or an unpacked hand-in

    def zip_data(self) -> bytes:
        """The zip's bytes, read now; HandinError if they changed since the hand-in was found."""
        data = self.zip_bytes if self.zip_bytes is not None else self.zip_path.read_bytes()
        for member in self.members:
            data = zipfile.ZipFile(io.BytesIO(data)).read(member)
        if self.zip_bytes is None and hashlib.sha256(data).hexdigest() != self.sha256:
            raise HandinError(f"{self.name}: changed on disk while the batch ran; grade it again")
        return data


@dataclass
class Unpacked:
    root: Path
    files: dict = field(default_factory=dict)   # role -> Path: "assignment", "utils", "log", "err"
    notes: list = field(default_factory=list)   # what normalising did, for feedback
    run: object = None                          # grader.pipeline.runs.Run of the log, when there is one


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


def _stem(name: str) -> str:
    stem = name.split("!")[-1]
    return stem[:-4] if stem.lower().endswith(".zip") else stem


def id_match(name: str, pattern: str):
    """The match of `pattern` (a regex or an LMS preset) on a hand-in's name, or None."""
    match = re.search(id_regex(pattern), _stem(name))
    return match if match and match.group("id") else None


def student_id(name: str, pattern: str) -> str:
    """The id in a hand-in's name (for a zip in a bulk download, its path there) by `pattern`'s `id`
    group; a name that does not match keeps its whole name (summary.md lists those)."""
    match = id_match(name, pattern)
    ident = match.group("id") if match else _stem(name)
    return re.sub(r"[^A-Za-z0-9._@+-]+", "_", ident).strip("._") or "unnamed"


def _is_handin_folder(path: Path) -> bool:
    """assignment4.py at its top, or inside its only folder (a hand-in unpacked with its folder)."""
    if (path / "assignment4.py").is_file():
        return True
    entries = [e for e in path.iterdir() if not JUNK.search(e.name)]
    return len(entries) == 1 and entries[0].is_dir() and (entries[0] / "assignment4.py").is_file()


def _zip_members(data: bytes):
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return [i.filename for i in z.infolist()]
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError):
        return None


def folder_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def discover(paths, pattern: str = r"(?P<id>.+)") -> tuple:
    """The hand-ins under `paths`, and the problems met finding them ([(name, message)])."""
    found = find_handins(paths, pattern)
    return found.handins, [(u.name, u.message) for u in found.unreadable] + \
        [(path.name, message) for path, message in found.errors]


def find_handins(paths, pattern: str = r"(?P<id>.+)") -> Found:
    """The hand-ins under `paths`, those that cannot be read, and the paths that hold none."""
    found, problems = [], []
    unreadable = []

    def add_zip(name, data, path, chain=()):
        members = _zip_members(data)
        if members is None:
            unreadable.append(Unreadable(name, student_id(name, pattern), hashlib.sha256(data).hexdigest(),
                                         f"{name}: not a readable zip file; ask for the hand-in again"))
            return
        content = [m for m in members if not m.endswith("/") and not JUNK.search(m)]
        inner = [m for m in content if m.lower().endswith(".zip")]
        if len(inner) > 1 and len(inner) == len(content):
            # A bulk download: every member is a hand-in of its own. (A single inner zip is a
            # hand-in zipped twice; unpack() opens it.)
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                for m in inner:
                    if z.getinfo(m).file_size > 200 << 20:
                        unreadable.append(Unreadable(f"{name}!{m}", student_id(f"{name}!{m}", pattern), "",
                                                     f"{name}!{m}: over 200 MB, not opened"))
                    else:
                        add_zip(f"{name}!{m}", z.read(m), path, chain + (m,))
            return
        found.append(Handin(name=name, student=student_id(name, pattern),
                            sha256=hashlib.sha256(data).hexdigest(), zip_path=path, members=chain))

    for path in map(Path, paths):
        before = len(found) + len(unreadable)
        if not path.exists():
            problems.append((path, f"{path}: no such file or folder"))
            continue
        if path.is_file() and path.suffix.lower() == ".zip":
            add_zip(path.name, path.read_bytes(), path.absolute())
        elif path.is_dir() and _is_handin_folder(path):
            found.append(Handin(name=path.name, student=student_id(path.name, pattern),
                                sha256=folder_digest(path), folder=path))
        elif path.is_dir():
            for entry in sorted(path.iterdir()):
                if entry.is_file() and entry.suffix.lower() == ".zip":
                    add_zip(entry.name, entry.read_bytes(), entry.absolute())
                elif entry.is_dir() and _is_handin_folder(entry):
                    found.append(Handin(name=entry.name, student=student_id(entry.name, pattern),
                                        sha256=folder_digest(entry), folder=entry))
            if len(found) + len(unreadable) == before:
                problems.append((path, f"{path}: no hand-in in it (no .zip file, no folder with assignment4.py)"))
        else:
            problems.append((path, f"{path}: not a zip file or a folder of hand-ins"))
    return Found(handins=found, unreadable=unreadable, errors=problems)


def _safe_name(info: zipfile.ZipInfo, zip_name: str) -> str:
    raw = info.filename
    if not info.flag_bits & 0x800 and not raw.isascii():
        # Without the UTF-8 flag Python decoded the name as cp437; its bytes must still be UTF-8.
        try:
            raw = raw.encode("cp437").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            raise HandinError(f"{zip_name}: the member name {info.filename!r} is not valid UTF-8; "
                              f"re-create the zip with plain file names") from None
    if "\x00" in raw or "\\" in raw:
        raise HandinError(f"{zip_name}: the member name {raw!r} has characters a file name cannot have")
    path = PurePosixPath(raw)
    if path.is_absolute() or re.match(r"^[A-Za-z]:", raw):
        raise HandinError(f"{zip_name}: the member {raw!r} has an absolute path; zip the files, not their location")
    if ".." in path.parts:
        raise HandinError(f"{zip_name}: the member {raw!r} points outside the hand-in ('..'); refused")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise HandinError(f"{zip_name}: the member {raw!r} is a symbolic link; zip the files themselves")
    return raw


def extract_zip(data: bytes, dest: Path, zip_name: str, limits) -> list:
    """Extract a zip into `dest` within `limits` (rubric.files); return the notes on what was dropped."""
    max_member = int(limits.max_member_mb * (1 << 20))
    max_total = int(limits.max_total_mb * (1 << 20))
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise HandinError(f"{zip_name}: not a readable zip file ({e}); ask for the hand-in again") from e
    infos = z.infolist()
    if len(infos) > limits.max_members:
        raise HandinError(f"{zip_name}: {len(infos)} members, more than the {limits.max_members} allowed; "
                          f"hand in only the four required files")
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
            target.parent.mkdir(parents=True, exist_ok=True)
            written = 0
            try:
                with z.open(info) as src, open(target, "wb") as out:
                    while chunk := src.read(CHUNK):
                        written += len(chunk)
                        total += len(chunk)
                        if written > max_member or total > max_total:
                            raise HandinError(f"{zip_name}: unpacks to more than the limits allow "
                                              f"({limits.max_member_mb:g} MB a file, {limits.max_total_mb:g} MB "
                                              f"in all): a zip bomb, or files that do not belong in it")
                        out.write(chunk)
            except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, RuntimeError,
                    NotImplementedError) as e:
                raise HandinError(f"{zip_name}: {name} cannot be unpacked ({e})") from e
    notes = []
    if dropped:
        shown = sorted({PurePosixPath(d).parts[0] if "__MACOSX" in d else PurePosixPath(d).name for d in dropped})
        notes.append(f"left out {len(dropped)} file(s) that do not belong in a hand-in: {', '.join(shown[:5])}")
    return notes


def _strip_single_folder(root: Path) -> list:
    entries = [e for e in root.iterdir()]
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        inner = entries[0]
        for child in list(inner.iterdir()):
            child.rename(root / child.name)
        inner.rmdir()
        return [f"the files were inside a folder '{inner.name}/'; hand in the files themselves next time"]
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
    rubric asks of a run, grader.pipeline.runs.LogRule, to choose among several)."""
    dest.mkdir(parents=True, exist_ok=True)
    notes = []
    if handin.folder is None:
        notes += extract_zip(handin.zip_data(), dest, handin.name, limits)
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
        nested = sorted(inner, key=lambda p: (len(p.parts), p.name))[0]
        nested_dest = dest / "_nested"
        notes += extract_zip(nested.read_bytes(), nested_dest, f"{handin.name}!{nested.name}", limits)
        notes += _strip_single_folder(nested_dest)
        notes.append(f"the files were inside another zip, {nested.name}; hand in one zip next time")
    files, run = locate(dest, notes, rule)
    if "assignment" not in files:
        names = sorted(p.name for p in dest.rglob("*") if p.is_file())[:8]
        raise HandinError(f"{handin.name}: no assignment4.py in the hand-in (found: {', '.join(names) or 'nothing'}); "
                          f"hand in a zip with assignment4.py, utils.py and the run's log files")
    return Unpacked(root=dest, files=files, notes=notes, run=run)
