"""Messages between the processes that run hand-in code and the grader.

Each message is a 4-byte big-endian length and that many bytes of UTF-8 JSON, written to a pipe
that only the grader's side reads: never stdout, which a hand-in can print anything to. Nothing
is unpickled; tensors travel as shape + float64 bytes and are validated on receipt.

Between the executor and its zygote, several processes write in turn to one pipe (the zygote,
each world's leader), and any of them may die in the middle of a message. There each message is a
frame of its own (`send_framed`, `FramedReader`): a mark, the world it belongs to, its length and
a checksum of its bytes. The reader hands on every whole frame, in order, with its world, and
steps over a torn one to the next mark: no message is lost behind another, none is taken for
another world's.
"""

import base64
import functools
import json
import os
import re
import struct
import zlib

from grader.typed import without_lone_surrogates


MAX_MESSAGE_BYTES = 16 << 20
MAX_TENSOR_NUMEL = 1 << 20
PIPE_BYTES = 1 << 20   # fs.pipe-max-size's default: what any user may ask a pipe to hold


class ChannelError(ValueError):
    """A message that is malformed, too large, or not what the protocol allows."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def widen(*fds: int) -> None:
    """Let each pipe of `fds` hold PIPE_BYTES (F_SETPIPE_SZ, Linux): a world's report (about 350 KB
    at the default check) then crosses in one write and one read, where a pipe of 64 KB had the
    leader and the executor take turns, a wake-up each. Where the kernel refuses (another system,
    a user past fs.pipe-user-pages-soft) a pipe stays as it was."""
    import fcntl
    for fd in fds if hasattr(fcntl, "F_SETPIPE_SZ") else ():
        try:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass


def unread(fd: int) -> int:
    """Bytes written to the pipe `fd` (either end, on Linux) that its reader has not read; 0 where
    the system does not say."""
    import fcntl
    import termios
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def send(fd: int, message: dict) -> None:
    """Write one message to `fd`, whole (loops over partial writes)."""
    body = json.dumps(message, separators=(",", ":")).encode()
    _write_all(fd, struct.pack(">I", len(body)) + body)


MARK = b"\xa4WLD"
FRAME = struct.Struct(">4sQII")   # mark, world, length of the body, CRC-32 of the body


def body_of(message: dict) -> bytes:
    """What a frame carries of `message`: its JSON, compact (ASCII: a character a byte)."""
    return json.dumps(message, separators=(",", ":")).encode()


def send_framed(fd: int, world: int, message: dict = None, body: bytes = None) -> None:
    """Write one message of world `world` to `fd` as a frame (world 0: none in particular), given as
    the message or as its `body` (body_of's); one past the size limit is refused whole
    (ChannelError), never written torn."""
    body = body_of(message) if body is None else body
    if len(body) > MAX_MESSAGE_BYTES:
        raise ChannelError(f"message of {len(body)} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
    _write_all(fd, FRAME.pack(MARK, world, len(body), zlib.crc32(body)) + body)


# A lone UTF-16 surrogate written as a JSON escape (any case): what a hand-in's exception text may
# hold, and no file's encoding can write.
LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _message(body: bytes) -> dict:
    try:
        message = json.loads(body)
        if LONE_SURROGATE.search(body):   # a pair of escapes is one character once read: what stays is lone
            message = without_lone_surrogates(message)
    except ValueError as e:   # not UTF-8, not JSON, or a number too long to read (Python 3.11's limit)
        raise ChannelError(f"message is not JSON ({e})") from e
    except RecursionError:   # nested deeper than the parser's stack: a frame no sender of ours writes
        raise ChannelError("message is nested too deep to read") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ChannelError("message is not an object with a 'type'")
    return message


def _discard(fd: int, n: int) -> bool:
    """Read `n` bytes from `fd` into one buffer and wipe it: nothing of them stays in this process's
    memory. Whether all `n` came."""
    buffer = bytearray(min(n, 1 << 16))
    try:
        while n > 0:
            got = os.readv(fd, [memoryview(buffer)[:min(n, len(buffer))]])
            if not got:
                return False
            n -= got
        return True
    finally:
        buffer[:] = bytes(len(buffer))


def read_framed(fd: int, skip_world: int = None):
    """Read exactly one frame from `fd` (blocking) and not a byte more: (world, message), or None at
    end of file. For a stream only the grader writes: a frame that does not check out is an error.
    Frames of world `skip_world` (what a world's leader left unread) are stepped over unread: their
    bytes are wiped, never decoded."""
    while True:
        frame = _read_framed(fd, skip_world)
        if frame != "skipped":
            return frame


def _read_exactly(fd: int, n: int):
    """`n` bytes from `fd` (blocking) and not a byte more; None at end of file."""
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _read_framed(fd: int, skip_world):
    exactly = functools.partial(_read_exactly, fd)
    head = exactly(FRAME.size)
    if head is None:
        return None
    mark, world, length, crc = FRAME.unpack(head)
    if mark != MARK or length > MAX_MESSAGE_BYTES:
        raise ChannelError("not a frame, or one over the size limit")
    if skip_world is not None and world == skip_world:
        return "skipped" if _discard(fd, length) else None
    body = exactly(length)
    if body is None:
        return None
    if zlib.crc32(body) != crc:
        raise ChannelError("a frame whose checksum does not match")
    return world, _message(body)


class FramedReader:
    """Turns the bytes read from a pipe of frames into (world, message) pairs, in order.

    A frame cut short (its writer died) is stepped over as soon as a whole frame follows it; so is
    one whose bytes do not match its checksum or hold no message. `skipped` counts them."""

    def __init__(self):
        self._buffer = bytearray()
        self._searched = 1    # the buffer before this offset holds no other frame's mark
        self.skipped = 0

    def _whole(self, start: int):
        """(world, body, end) of a whole, intact frame at `start`; None if there is none (yet)."""
        if len(self._buffer) < start + FRAME.size:
            return None
        mark, world, length, crc = FRAME.unpack_from(self._buffer, start)
        end = start + FRAME.size + length
        if mark != MARK or length > MAX_MESSAGE_BYTES or len(self._buffer) < end:
            return None
        body = bytes(self._buffer[start + FRAME.size:end])
        return (world, body, end) if zlib.crc32(body) == crc else None

    def _torn_at(self, start: int) -> bool:
        """Whether the frame at `start` cannot be one (a bad mark, size or checksum)."""
        if len(self._buffer) < start + FRAME.size:
            return self._buffer[start:start + len(MARK)] != MARK[:len(self._buffer) - start]
        mark, _, length, _ = FRAME.unpack_from(self._buffer, start)
        return mark != MARK or length > MAX_MESSAGE_BYTES or \
            (len(self._buffer) >= start + FRAME.size + length and self._whole(start) is None)

    def _drop_to_next_frame(self) -> bool:
        """Drop the bytes before the next whole frame after the start; whether there was one. (A
        mark never occurs inside a frame: its body is ASCII JSON.)"""
        at = self._buffer.find(MARK, max(1, self._searched))
        pending = None          # the first mark whose frame may still be completed
        while at != -1:
            if self._whole(at) is not None:
                del self._buffer[:at]
                self._searched, self.skipped = 1, self.skipped + 1
                return True
            if pending is None and not self._torn_at(at):
                pending = at
            at = self._buffer.find(MARK, at + 1)
        self._searched = pending if pending is not None else max(1, len(self._buffer) - len(MARK) + 1)
        return False

    def feed(self, data: bytes) -> list:
        self._buffer += data
        pairs = []
        while self._buffer:
            frame = self._whole(0)
            if frame is None:
                if self._drop_to_next_frame():
                    continue
                if not self._torn_at(0):
                    break      # a frame still arriving
                # Nothing whole after a torn frame yet: keep only what may start the next one.
                del self._buffer[:self._searched]
                self._searched, self.skipped = 1, self.skipped + 1
                continue
            world, body, end = frame
            del self._buffer[:end]
            self._searched = 1
            try:
                pairs.append((world, _message(body)))
            except ChannelError:
                self.skipped += 1
        return pairs


def read_message(fd: int) -> dict:
    """Read exactly one message from `fd` (blocking) and not a byte more; None at end of file."""
    exactly = functools.partial(_read_exactly, fd)
    head = exactly(4)
    if head is None:
        return None
    (length,) = struct.unpack(">I", head)
    if length > MAX_MESSAGE_BYTES:
        raise ChannelError(f"message of {length} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
    body = exactly(length)
    if body is None:
        return None
    messages = Reader().feed(head + body)
    return messages[0]


class Reader:
    """Turns the bytes read from one pipe into messages."""

    def __init__(self):
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list:
        self._buffer += data
        messages = []
        while len(self._buffer) >= 4:
            (length,) = struct.unpack(">I", self._buffer[:4])
            if length > MAX_MESSAGE_BYTES:
                raise ChannelError(f"message of {length} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
            if len(self._buffer) < 4 + length:
                break
            body = bytes(self._buffer[4:4 + length])
            del self._buffer[:4 + length]
            messages.append(_message(body))
        return messages


def encode_tensor(tensor) -> dict:
    """A floating tensor as {"shape", "dtype", "data"}: its values as float64, base64-encoded."""
    import torch   # here: the executor reads frames before the grader has imported torch
    values = tensor.detach().to("cpu", torch.float64).contiguous()
    return {"shape": list(values.shape), "dtype": str(tensor.dtype).replace("torch.", ""),
            "data": base64.b64encode(values.numpy().tobytes()).decode()}


def decode_tensor(encoded):
    """The float64 tensor of `encode_tensor`'s output, after checking every field."""
    import torch
    if not isinstance(encoded, dict):
        raise ChannelError("tensor is not an object")
    shape = encoded.get("shape")
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d for d in shape)):
        raise ChannelError(f"tensor shape {shape!r} is not a list of sizes")
    numel = 1
    for d in shape:
        numel *= d
    if numel > MAX_TENSOR_NUMEL:
        raise ChannelError(f"tensor of {numel} elements is over the limit")
    try:
        raw = base64.b64decode(encoded.get("data", ""), validate=True)
    except (ValueError, TypeError) as e:
        raise ChannelError("tensor data is not base64") from e
    if len(raw) != 8 * numel:
        raise ChannelError(f"tensor data has {len(raw)} bytes, shape {shape} needs {8 * numel}")
    if not raw:   # torch reads no tensor from an empty buffer
        return torch.zeros(shape, dtype=torch.float64)
    return torch.frombuffer(bytearray(raw), dtype=torch.float64).reshape(shape).clone()


def decode_sent(encoded):
    """The flat float64 tensor of the values a rank handed one collective (base64 float32, as
    grader.rerun.rank.hooks records them), or None where there are none or they are not that."""
    import torch
    if not isinstance(encoded, str) or not encoded or len(encoded) > 4 * MAX_TENSOR_NUMEL:
        return None
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (ValueError, TypeError):
        return None
    if not raw or len(raw) % 4:
        return None
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).to(torch.float64)
