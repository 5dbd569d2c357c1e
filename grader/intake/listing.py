"""What is on disk, opened only when it is read: a file, or a member of a zip (`Blob`); a folder's or
a zip's files (`Listing`).

A download of 300 hand-ins may be a gigabyte: intake keeps a `Blob` (a path, and a member's name
when the file is inside a zip) per file, never its bytes. A hand-in's files are read when it is
graded, member by member, straight from the zip on disk (`open` reads the zip's central directory,
then that member alone), so a batch's memory does not grow with the download. Digests are taken
as the bytes stream past (`digest`, `files_digest`), with the same results as hashing the bytes whole.
"""

import errno
import hashlib
import io
import re
import struct
import sys
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from grader.names import inside

# What no hand-in or download is made of: an OS's or a tool's litter, dropped wherever it is met.
JUNK = re.compile(r"(^|/)(__MACOSX|__pycache__|\.git|\.ipynb_checkpoints)(/|$)|(^|/)(\.DS_Store|\._[^/]*|Thumbs\.db)$")
CHUNK = 1 << 16
SPOOL_BYTES = 8 << 20             # a zip inside a zip is copied out to read it: in memory up to this, then on disk
MAX_FILES = 20000                 # files a download may list
MAX_MEMBER_BYTES = 200 << 20      # bytes a file of a download may unpack to
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, RuntimeError, NotImplementedError,
              ValueError, zlib.error)


class BlobError(ValueError):
    """A file that cannot be read (gone, damaged, over its cap); the message says why, `name` which."""

    def __init__(self, message: str, name: str = ""):
        super().__init__(message)
        self.name = name


class DownloadError(ValueError):
    """A download that cannot be read as the TA gave it; the message names the file."""


class _Member:
    """A member of a zip opened for reading, closing its zip with it."""

    def __init__(self, z: zipfile.ZipFile, member):
        self.z, self.f = z, z.open(member)

    def read(self, n: int = -1) -> bytes:
        return self.f.read(n)

    def close(self) -> None:
        self.f.close()
        self.z.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass(frozen=True)
class Blob:
    """One file: `path` itself, or the member `member` of the zip at `path`."""
    path: Path
    member: str = ""
    size: int = 0          # as the folder or the zip's directory says it (before it is read)

    def open(self, z: zipfile.ZipFile = None):
        """A binary stream of the bytes; `z`: the zip at `path`, already open (a listing's)."""
        try:
            if not self.member:
                return open(self.path, "rb")
            if z is not None:
                return z.open(self.member)
            z = zipfile.ZipFile(self.path)
            try:
                return _Member(z, self.member)
            except BaseException:
                z.close()
                raise
        except (KeyError, *ZIP_ERRORS) as e:
            raise BlobError(f"cannot be read ({e})") from None

    def chunks(self, z: zipfile.ZipFile = None, cap: int = None):
        """The bytes, CHUNK at a time; BlobError past `cap` bytes, whatever the size declared."""
        seen = 0
        try:
            with self.open(z) as f:
                while chunk := f.read(CHUNK):
                    seen += len(chunk)
                    if cap is not None and seen > cap:
                        raise BlobError(f"over {cap >> 20} MB unpacked; not opened")
                    yield chunk
        except ZIP_ERRORS as e:
            raise BlobError(f"cannot be read ({e})") from None

    def read(self, cap: int, z: zipfile.ZipFile = None) -> bytes:
        """The bytes, never more than `cap` of them (BlobError past it)."""
        return b"".join(self.chunks(z, cap))

    def digest(self, z: zipfile.ZipFile = None, cap: int = None) -> str:
        h = hashlib.sha256()
        for chunk in self.chunks(z, cap):
            h.update(chunk)
        return h.hexdigest()

    def seekable(self, cap: int, z: zipfile.ZipFile = None) -> tuple:
        """(a seekable binary file of the bytes, their sha256): the file itself when on disk, else a
        copy of the member (in memory up to SPOOL_BYTES, then on disk); the caller closes it. A zip
        member is copied out because reading a zip inside it would decompress it again at every seek."""
        if not self.member:
            return open(self.path, "rb"), self.digest(cap=cap)
        spool, h = _spool(), hashlib.sha256()
        try:
            for chunk in self.chunks(z, cap):
                h.update(chunk)
                spool.write(chunk)
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        return spool, h.hexdigest()


def _spool():
    """A file held in memory up to SPOOL_BYTES, then on disk. Python 3.10's SpooledTemporaryFile
    lacks what zipfile asks of a file (seekable): there, a file on disk from the start."""
    if sys.version_info >= (3, 11):
        return tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
    return tempfile.TemporaryFile()


def files_digest(files: dict, z: zipfile.ZipFile = None, cap: int = None) -> str:
    """The sha256 of a hand-in given as files (name -> Blob or bytes, in name order): the same as
    hashing `name \\0 bytes \\0` for each, whole."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0")
        data = files[name]
        try:
            for chunk in [data] if isinstance(data, bytes) else data.chunks(z, cap):
                h.update(chunk)
        except BlobError as e:
            raise BlobError(str(e), name) from None
        h.update(b"\0")
    return h.hexdigest()


class Listing:
    """The files of a zip or a folder on disk: POSIX path relative to its root -> its Blob. A zip's
    listing keeps the zip open (`close` it) so that reading many members parses its directory once."""

    def __init__(self, label: str, blobs: dict, z: zipfile.ZipFile = None, archive: bool = False):
        self.label, self.blobs, self.z = label, blobs, z
        self.archive = archive   # `label` names the zip itself: what is in it is shown after grader.names.INSIDE

    @property
    def paths(self):
        return self.blobs

    @classmethod
    def of_zip(cls, path: Path, label: str = None):
        """The listing of the zip at `path`, or None when it is no readable zip."""
        try:
            z = zipfile.ZipFile(path)
            infos = z.infolist()
        except ZIP_ERRORS:
            return None
        label = label or path.name
        if len(infos) > MAX_FILES:
            z.close()
            raise DownloadError(f"{label}: {len(infos)} members, more than the {MAX_FILES} a download may "
                                f"list; give it unzipped, or in parts")
        blobs = {i.filename: Blob(Path(path).absolute(), i.filename, i.file_size) for i in infos
                 if not i.is_dir() and not JUNK.search(i.filename) and not i.filename.startswith("/")
                 and ".." not in PurePosixPath(i.filename).parts}
        return cls(label, blobs, z, archive=True)

    @classmethod
    def of_folder(cls, folder: Path):
        blobs = {}
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink() or not path.is_file() or JUNK.search(rel):
                continue
            if len(blobs) >= MAX_FILES:
                raise DownloadError(f"{folder}: more than {MAX_FILES} files under it; give the download's "
                                    f"folder itself, not a folder above it")
            blobs[rel] = Blob(path.absolute(), "", path.stat().st_size)
        return cls(folder.resolve().name or str(folder), blobs)   # by its name, as a zip is, wherever it lies

    def close(self) -> None:
        if self.z is not None:
            self.z.close()

    def stripped(self):
        """The listing without a single folder everything is in (a download unzipped into a folder)."""
        tops = {PurePosixPath(p).parts[0] for p in self.blobs}
        if len(tops) == 1 and all("/" in p for p in self.blobs):
            top = tops.pop()
            cut = len(top) + 1
            return Listing(self.where(top), {p[cut:]: b for p, b in self.blobs.items()}, self.z)
        return self

    def blob(self, rel: str) -> Blob:
        """The Blob of `rel`, refused (DownloadError, naming it) when it declares more than MAX_MEMBER_BYTES."""
        if self.blobs[rel].size > MAX_MEMBER_BYTES:
            raise DownloadError(f"{self.where(rel)}: {self.blobs[rel].size} bytes, over {MAX_MEMBER_BYTES >> 20} MB; "
                                f"not opened")
        return self.blobs[rel]

    def read(self, rel: str) -> bytes:
        """The bytes of `rel` (a small file the listing itself needs: metadata, a digest's input)."""
        try:
            return self.blob(rel).read(MAX_MEMBER_BYTES, self.z)
        except BlobError as e:
            raise DownloadError(f"{self.where(rel)}: {e}") from None

    def where(self, rel: str) -> str:
        """How a file of the listing is shown: `download.zip › folder/file`, or `folder/file`."""
        return inside(self.label, rel) if self.archive else f"{self.label}/{rel}"


def zip_entries(data) -> int:
    """How many members the zip `data` (bytes, or a seekable binary file) says its central directory
    holds, read from its end record (zip64's where there is one) before anything parses the
    directory: millions of entries would cost the grader gigabytes there. -1 where no end record
    is found (zipfile then says what is wrong)."""
    f = io.BytesIO(data) if isinstance(data, bytes) else data
    size = f.seek(0, io.SEEK_END)
    f.seek(max(0, size - (1 << 16) - 22))
    tail = f.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        return -1
    entries = struct.unpack("<H", tail[at + 10:at + 12])[0]
    locator = tail.rfind(b"PK\x06\x07", 0, at)
    if entries == 0xFFFF and locator >= 0 and len(tail) >= locator + 20:
        f.seek(struct.unpack("<Q", tail[locator + 8:locator + 16])[0])
        record = f.read(56)
        if len(record) == 56 and record[:4] == b"PK\x06\x06":
            entries = struct.unpack("<Q", record[32:40])[0]
    f.seek(0)
    return entries


def folder_digest(folder: Path) -> str:
    """The digest of a hand-in given as a folder: every file's path and bytes, in order."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


# A name no file may have where the hand-in is written: a file and a folder of one name, one over 255 bytes
NAMING = (errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.EILSEQ, errno.EINVAL)


def said(e: BaseException) -> str:
    """What went wrong unpacking or writing a hand-in, without the grader's own paths (an OSError
    names the file it was writing, in the grader's scratch folder): what the student may read.
    An OSError of the grader's own disk (full, not writable) is not the hand-in's: raised as it is."""
    if isinstance(e, OSError) and e.errno is not None and e.errno not in NAMING:
        raise e
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)
