"""Messages between the processes that run hand-in code and the grader.

Each message is a 4-byte big-endian length and that many bytes of UTF-8 JSON, written to a pipe
that only the grader's side reads: never stdout, which a hand-in can print anything to. Nothing
is unpickled; tensors travel as shape + float64 bytes and are validated on receipt.
"""

import base64
import json
import os
import struct

import torch

MAX_MESSAGE_BYTES = 16 << 20
MAX_TENSOR_NUMEL = 1 << 20


class ChannelError(ValueError):
    """A message that is malformed, too large, or not what the protocol allows."""


def send(fd: int, message: dict) -> None:
    """Write one message to `fd`, whole (loops over partial writes)."""
    body = json.dumps(message, separators=(",", ":")).encode()
    data = struct.pack(">I", len(body)) + body
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def read_message(fd: int) -> dict:
    """Read exactly one message from `fd` (blocking) and not a byte more; None at end of file."""
    def exactly(n):
        data = b""
        while len(data) < n:
            chunk = os.read(fd, n - len(data))
            if not chunk:
                return None
            data += chunk
        return data
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
            try:
                message = json.loads(body)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ChannelError(f"message is not JSON ({e})") from e
            if not isinstance(message, dict) or not isinstance(message.get("type"), str):
                raise ChannelError("message is not an object with a 'type'")
            messages.append(message)
        return messages


def encode_tensor(tensor: torch.Tensor) -> dict:
    """A floating tensor as {"shape", "dtype", "data"}: its values as float64, base64-encoded."""
    values = tensor.detach().to("cpu", torch.float64).contiguous()
    return {"shape": list(values.shape), "dtype": str(tensor.dtype).replace("torch.", ""),
            "data": base64.b64encode(values.numpy().tobytes()).decode()}


def decode_tensor(encoded) -> torch.Tensor:
    """The float64 tensor of `encode_tensor`'s output, after checking every field."""
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
    return torch.frombuffer(bytearray(raw), dtype=torch.float64).reshape(shape).clone()
