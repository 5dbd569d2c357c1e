"""What crosses a process boundary while hand-in code is re-run: the messages, typed, and one codec.

    grader (executor)  --Setup, WorldRequest, WorldJob, DataKey, Exit-->  zygote / world leader
    grader (executor)  <--Hello, WorldReport--            zygote / world leader
    world supervisor   --Load, Run (part, token, the part's data)-->  each rank (its data pipe)
    world supervisor   <--Joined, Loading, Ready, Result... / LoadFailed / InfraError--  each rank

A rank runs hand-in code, so what it sends is untrusted: `decode` checks the type tag and every
field's type, refuses a key no field has (grader.typed), and raises ProtocolError on anything else;
the supervisor then ends the world. The supervisor, not the rank, says which part runs next (Run,
with a fresh token the Result must echo), so a result for a part the supervisor has not started is
a forgery by construction; the order of a rank's messages is the supervisor's to check
(grader.rerun.supervise). Frames and tensors are grader.rerun.wire.channel's.
"""

import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import Optional, Union

from grader import typed
from grader.limits import PART_SECONDS, WORLD_START_SECONDS
from grader.rerun.wire import channel


class ProtocolError(channel.ChannelError):
    """A message that is not one the protocol allows, or has a field of the wrong type."""


class StopReason(str, Enum):
    """Why a world ended before every rank reported every part."""
    LOAD_FAILED = "load_failed"        # assignment4.py did not load (a syntax error, an import)
    START_TIMEOUT = "start_timeout"    # the ranks did not load the code in time
    TIMEOUT = "timeout"                # a part ran past its wall clock
    RANK_DIED = "rank_died"            # a rank (or the world's supervisor) exited before the end
    OUT_OF_MEMORY = "out_of_memory"    # the world passed limits.memory_mb (its watchdog or its cgroup ended it)
    DIST_ERROR = "dist_error"          # a collective failed on some rank
    RANKS_DISAGREE = "ranks_disagree"  # a part returned on some ranks and raised on others
    RANK_FAILED = "rank_failed"        # a part raised on a rank (crashed, out of memory) before every rank reported it
    PROTOCOL = "protocol"              # a malformed or out-of-order message (hand-in code writing to the pipe)
    INFRA_ERROR = "infra_error"        # the machinery failed: no part of the hand-in is to blame
                                       # (believed from a rank only before its hand-in code loads)


class RankStatus(str, Enum):
    """How one part ended on one rank."""
    OK = "ok"                          # returned a weight
    NOT_IMPLEMENTED = "not_implemented"
    CRASHED = "crashed"
    OOM = "oom"
    DIST_ERROR = "dist_error"          # a collective failed; the rank stops after reporting it


# How a part fails on a rank of its own doing (DIST_ERROR is a collective another rank failed):
# once one rank reports one, the part has failed whatever the others do (StopReason.RANK_FAILED).
FAILED_ALONE = (RankStatus.CRASHED, RankStatus.OOM)


OWN_FILES = ("assignment4.py", "utils.py")   # the hand-in's own files: the only frames a traceback keeps


@dataclass
class ErrorInfo:
    exception: str = ""                # the exception's last line
    traceback: str = ""                # the frames of OWN_FILES only


@dataclass
class Timeouts:
    world_start: float = WORLD_START_SECONDS
    part: float = PART_SECONDS         # each part, from the moment the supervisor starts it on a rank


@dataclass
class WorldJob:
    """One world to run: which parts of which code, at which configuration."""
    TYPE: typing.ClassVar[str] = "job"
    work_dir: str                      # the world's own folder (the world's leader makes it)
    code: dict[str, str]               # file name -> text: the hand-in's assignment4.py, the provided utils.py
    store: str                         # gloo's file store
    world_size: int
    parts: list[str]
    check: dict[str, bool | int | float | str]   # global_batch_size, input_dim, output_dim, seed,
                                       # accumulation_steps, hidden_dim, nodes (the world's layout), kind
                                       # (grader.parts.KINDS), and the keys only an optional part reads
                                       # (a part's own_sizes: a switch, a number such as a shift); a
                                       # scaled world's "scaled" and "targets" (JSON: grader.verdict.carried)
    pg_timeout: float                  # how long a collective waits for a missing rank
    limits: dict[str, int]             # grader.rubric.Limits, as a mapping
    timeouts: Timeouts = field(default_factory=Timeouts)
    code_dir: str = ""                 # where the world's leader wrote `code`
    compiled: str = ""                 # assignment4.py and utils.py as an earlier world of the same `code`
                                       # compiled them (grader.rerun.rank.source.compiled_blob), or "": compile


@dataclass
class Setup:
    """Executor to zygote, first: the kit's folder on the machine, which the zygote checks it cannot
    see (sent here, never on its command line, which any process that sees it can read)."""
    TYPE: typing.ClassVar[str] = "setup"
    kit: str = ""


@dataclass
class WorldRequest:
    TYPE: typing.ClassVar[str] = "world"   # the zygote forks on this; only the fork reads the job


@dataclass
class DataKey:
    """The batch's data key (grader.rerun.wire.secret), hex: sent after the job, read by the world's
    leader only once it has forked the ranks."""
    TYPE: typing.ClassVar[str] = "data_key"
    key: str = ""


@dataclass
class Exit:
    TYPE: typing.ClassVar[str] = "exit"


@dataclass
class Hello:
    TYPE: typing.ClassVar[str] = "hello"
    isolation: dict = field(default_factory=dict)


@dataclass
class Ready:
    TYPE: typing.ClassVar[str] = "ready"
    skipped_lines: list[int] = field(default_factory=list)   # script statements not executed


@dataclass
class PartSecret:
    """The seeds of one part's data in one world, drawn by the world's leader after it forked the
    ranks (grader.rerun.wire.secret says what each seed makes). A rank is sent its own view: the blocks
    that are not its own left out (None), and only its own noise seed."""
    seed: Optional[int] = None          # what every rank of the part shares (the batch, or its inputs)
    blocks: list[Optional[int]] = field(default_factory=list)   # one per rank: its own rows or columns
    noise: list[Optional[int]] = field(default_factory=list)    # one per rank: what stands in for the others'


@dataclass
class Load:
    """Supervisor to rank: every rank has joined gloo; load the hand-in's code now. Nothing of a
    hand-in runs in a world before its last rank joined: gloo's first side of a connection is done
    when it has written to the socket, and a rank whose hand-in then ended would close it under a
    peer still reading it, a join failing as if the machine had (closed by peer)."""
    TYPE: typing.ClassVar[str] = "load"


@dataclass
class Run:
    """Supervisor to rank: run `part` now, on this data; the Result must carry `token`."""
    TYPE: typing.ClassVar[str] = "run"
    part: str = ""
    token: str = ""
    data: PartSecret = field(default_factory=PartSecret)


@dataclass
class Joined:
    """Rank to supervisor: gloo is up; the rank waits for Load (the last message an infrastructure
    error may follow)."""
    TYPE: typing.ClassVar[str] = "joined"


@dataclass
class Loading:
    """Rank to supervisor: the hand-in's code is about to run; from here on the rank is the hand-in's."""
    TYPE: typing.ClassVar[str] = "loading"


@dataclass
class Result:
    """One part's result on one rank."""
    TYPE: typing.ClassVar[str] = "result"
    part: str = ""
    status: RankStatus = RankStatus.CRASHED
    weight: Optional[dict] = None      # grader.rerun.wire.channel.encode_tensor's form
    extra: dict[str, dict] = field(default_factory=dict)   # more tensors, by name, in the same form
                                                           # (a backward check's gradients)
    comm: list[dict] = field(default_factory=list)   # {"op", "numel", "reduce_op"} per collective called
                                                     # (the rank's word: a hint for feedback, never a verdict)
    token: str = ""                    # the token of the Run this answers
    devices: list[int] = field(default_factory=list)   # GPU indices the part asked for (cuda:5, set_device(5))
    seconds: float = 0.0
    error: Optional[ErrorInfo] = None
    oversize: int = 0                  # the values of a returned tensor refused for its size
                                       # (grader.rerun.wire.bounds; then no tensor, status crashed)


@dataclass
class LoadFailed:
    TYPE: typing.ClassVar[str] = "load_failed"
    error: ErrorInfo = field(default_factory=ErrorInfo)


@dataclass
class InfraError:
    TYPE: typing.ClassVar[str] = "infra_error"
    error: ErrorInfo = field(default_factory=ErrorInfo)


@dataclass
class CpuTime:
    """What every thread of a world's ranks had of the CPU when a part ran past its clock
    (grader.rerun.starved): seconds run, seconds ready to run but waiting, the cores the world could
    use, the threads waiting for the disk, whether the machine was short of memory then."""
    run: float
    wait: float
    cores: int
    disk: int = 0
    short: bool = False   # memory stalled tasks (PSI) or little was left: what makes pages be read back
    busy: Optional[float] = None   # seconds its threads ran or were ready to in a short window after


@dataclass
class Abort:
    reason: StopReason
    part: Optional[str] = None         # the part at which the world ended, when one is to blame
    detail: str = ""
    error: Optional[ErrorInfo] = None  # the exception that stopped the code from loading
    cpu: Optional[CpuTime] = None      # a part past its clock: what its ranks had of the CPU (None: unknown)
    unread: list[int] = field(default_factory=list)   # ...and the ranks that never took its order up (a
                                       # stall after the part before: the part itself never ran there)


@dataclass
class WorldReport:
    TYPE: typing.ClassVar[str] = "world_report"
    completed: list[str] = field(default_factory=list)   # parts every rank reported consistently
    results: dict[str, dict[int, Result]] = field(default_factory=dict)   # part -> rank -> result
    abort: Optional[Abort] = None
    exit_codes: dict[int, Optional[int]] = field(default_factory=dict)
    output: dict[int, str] = field(default_factory=dict)   # head and tail of each rank's stdout/stderr
    progress: dict[int, str] = field(default_factory=dict)   # the tail of each rank's rank<N>.calls:
                                                             # the collectives of its last part, one
                                                             # JSON line each, written before each call
    skipped_lines: list[int] = field(default_factory=list)
    seconds: float = 0.0
    # seconds: "forked" from the leader's start, "ready", "done" (every part settled), "ended" from the ranks' fork, "round_trip" the grader's
    timeline: dict[str, float] = field(default_factory=dict)
    isolation: dict = field(default_factory=dict)
    secrets: dict[str, PartSecret] = field(default_factory=dict)   # part -> the data its ranks were served
    compiled: str = ""   # the leader's compile of a job that came without one, for the next world of that code


Message = Union[Setup, WorldJob, WorldRequest, DataKey, Exit, Hello, Joined, Loading, Ready, Load, Run, Result,
                LoadFailed, InfraError, WorldReport]
TYPES = {cls.TYPE: cls for cls in typing.get_args(Message)}
RANK_MESSAGES = (Joined, Loading, Ready, Result, LoadFailed, InfraError)
ORDERS = (Load, Run)   # what a rank reads on its data pipe


def stopped(job: WorldJob, reason: StopReason, detail: str, part=None) -> WorldReport:
    """The report of a world that ended before any part was settled."""
    return WorldReport(results={p: {} for p in job.parts} if job else {},
                       abort=Abort(reason=reason, part=part, detail=detail))


# ---- the codec --------------------------------------------------------------------------------

def encode(message) -> dict:
    """A message as the JSON-ready mapping the channel sends: its fields and its `type`."""
    return {"type": message.TYPE, **typed.plain(message)}


def decode(data: dict, allowed=None):
    """The message of a mapping the channel read; ProtocolError when it is not one of `allowed`."""
    cls = TYPES.get(data.get("type"))
    if cls is None or (allowed is not None and cls not in allowed):
        raise ProtocolError(f"unexpected message type {str(data.get('type'))[:40]!r}")
    return typed.build(cls, data, cls.TYPE, ProtocolError, ignore=("type",))


def send(fd: int, message) -> None:
    channel.send(fd, encode(message))


def receive(fd: int, allowed=None):
    """The next message on `fd` (blocking), decoded; None at end of file."""
    data = channel.read_message(fd)
    return None if data is None else decode(data, allowed)
