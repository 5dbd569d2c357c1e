"""What a rank's torch is wrapped in while hand-in code runs: GPUs that land on the CPU, and a spy
on every collective a part calls, however it is reached: torch.distributed's functions, a process
group's own methods, the functional collectives' ops, or C++ (DistributedDataParallel's reducer),
through the dispatcher (grader.rerun.rank.collectives); each call recorded once, under the
function's name.

The spy's record names a hang (which collective each rank waited in, written before each call so
that it survives the kill), and grader.verdict.comm fails a parallel part whose ranks did not call
its collectives with the values they move. What tells apart a step that skips its communication
(the whole batch computed on every rank, an all-reduce of zeros) is first the data: in a parallel
part each rank holds real values only in its own share (grader.rerun.wire.secret), so only an exchange
gives the right weight. The rank's code could patch this spy anyway: its record can fail a part,
never pass one.

At a world asked to (`scaled`), the spy also changes what each of a part's moving collectives
(an all-reduce, an all-gather, a reduce-scatter) returns: once the call is done, its output is
multiplied by SCALES[k] for the part's k-th such call (the same on every rank, so the ranks still
agree). A part whose ranks exchange their data through these calls then comes out wrong; one whose
ranks swap it some other way and call them for show comes out right anyway, and
grader.verdict.comm fails it. The factors differ from call to call so that no ratio of two
collectives' results (a gradient summed, divided by a count summed) undoes them. An asynchronous
call (async_op=True) is waited for at once, then scaled: the handle it returns is done. Where the
grader placed the part's moves in its calls (`targets`), only those values are multiplied."""

import base64
import contextlib
import json
import os

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work
from torch.overrides import TorchFunctionMode

from grader.rerun.rank import collectives
from grader.rerun.rank.collectives import (COLLECTIVES, FUNCTION, FUNCTIONAL_OPS, GROUP_METHODS, METHOD, OP, SCALED, SCALES,
                                           functional_numel, numel, object_numel, output, reduce_name, reduce_op, scale_placed)


def _is_cuda(device) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


def cuda_index(device):
    """The GPU index a device names ("cuda:5", torch.device("cuda", 5), 5), or None ("cuda", "cpu")."""
    if isinstance(device, torch.device):
        return device.index if device.type == "cuda" else None
    if isinstance(device, str) and device.startswith("cuda:"):
        index = device[5:].strip()
        return int(index) if index.isdigit() and len(index) < 6 else None
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    return None


class CudaOnCpu(TorchFunctionMode):
    """Every tensor that code asks to put on a GPU stays on the CPU. The GPU index asked for is
    noted on `spy` (a CommRecorder), since on a node of LOCAL_WORLD_SIZE GPUs a higher one fails."""

    def __init__(self, spy=None):
        super().__init__()
        self.spy = spy

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Every torch call of the part comes here (about 300 a rank): the common one, no device
        # asked for, goes straight on.
        if func is not torch.Tensor.cuda and func is not torch.Tensor.to and not (kwargs and "device" in kwargs):
            return func(*args, **(kwargs or {}))
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            if self.spy is not None:
                self.spy.asked_for(args[1] if len(args) > 1 else kwargs.get("device"))
            return args[0]
        if _is_cuda(kwargs.get("device")):
            if self.spy is not None:
                self.spy.asked_for(kwargs["device"])
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            if self.spy is not None:
                self.spy.asked_for(args[1])
            args = (args[0], "cpu") + tuple(args[2:])
        return func(*args, **kwargs)


def disarm_cuda_calls(spy=None) -> None:
    """torch.cuda calls that set up a GPU are no-ops here (there is none); the device set_device
    asks for is noted on `spy`.

    So is seeding an accelerator: torch.manual_seed also queues the seed for each accelerator not
    yet set up (CUDA, XPU, MTIA), and each time captures the whole stack as text (torch's
    `_lazy_call`: traceback.format_stack, which reads every frame's source file). A rank never sets
    one up (CudaOnCpu), so the queue is never read; capturing it cost about a sixth of a world's
    time (docs/scale.md)."""
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        setattr(torch.cuda, name, lambda *args, **kwargs: None)
    for accelerator in (torch.cuda, getattr(torch, "xpu", None), getattr(torch, "mtia", None)):
        for name in ("manual_seed", "manual_seed_all"):
            if accelerator is not None and hasattr(accelerator, name):
                setattr(accelerator, name, lambda seed: None)
    torch.cuda.set_device = lambda device, *args, **kwargs: spy.asked_for(device) if spy is not None else None
    torch.cuda.current_device = lambda: 0


def keep_the_world() -> None:
    """The world's process group, set up before any hand-in code ran, stays the hand-in's to use:
    init_process_group once it is up does nothing (code that sets up its own group where a script
    would, the handout's init_distributed, in a part or at load, runs on), and destroying it (a
    script's last line, in a part) leaves it up for the parts after. Another group it made is its own."""
    import torch.distributed.distributed_c10d as c10d
    init, destroy = c10d.init_process_group, c10d.destroy_process_group

    def init_process_group(*args, **kwargs):
        return None if dist.is_initialized() else init(*args, **kwargs)

    def destroy_process_group(group=None):
        return None if group is None or group is dist.group.WORLD else destroy(group)

    for module in (dist, c10d):
        module.init_process_group, module.destroy_process_group = init_process_group, destroy_process_group


def _wrapped(name: str, original, entry: str = FUNCTION):
    """`original`, each call handed to the rank's recorder (collectives.RECORDER) where there is one."""
    def recorded(*args, **kwargs):
        recorder = collectives.RECORDER
        if recorder is None:
            return original(*args, **kwargs)
        return recorder.call(name, entry, original, args, kwargs)
    recorded.__name__ = name
    recorded.__wrapped__ = original
    return recorded


_WRAPPED = []   # whether this process's collectives are wrapped (once, in the zygote: every rank shares them)


def wrap_collectives() -> None:
    """Wrap every collective a part may call in Python (COLLECTIVES, the process groups' methods,
    the functional collectives' autograd ops), once a process; until a rank installs its recorder
    the wrappers only pass calls on."""
    if _WRAPPED:
        return
    import torch.distributed.distributed_c10d as c10d
    from torch._C._distributed_c10d import Backend, ProcessGroup
    for name in COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapper = _wrapped(name, original)
        for module in (dist, c10d):
            if getattr(module, name, None) is original:
                setattr(module, name, wrapper)
    for group_class in (ProcessGroup, Backend):
        for method, name in GROUP_METHODS.items():
            if method in group_class.__dict__:   # its own, not inherited: each wrapped once
                setattr(group_class, method, _wrapped(name, group_class.__dict__[method], METHOD))
    # The functional ops are the dispatcher's (collectives.route); their autograd twins have autograd
    # kernels of their own there, and are wrapped here, their overloads (.default) still theirs.
    space = getattr(torch.ops, "_c10d_functional_autograd")
    for op, name in FUNCTIONAL_OPS.items():
        try:
            original = getattr(space, op)
        except (AttributeError, RuntimeError):
            continue   # not in this torch
        setattr(space, op, _Packet(_wrapped(name, original, OP), original))
    _WRAPPED.append(True)


class _Packet:
    """An op's packet, its call recorded (`recorded`), everything else (its overloads) the op's own."""

    def __init__(self, recorded, packet):
        self._recorded, self._packet = recorded, packet

    def __call__(self, *args, **kwargs):
        return self._recorded(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._packet, name)


class CommRecorder:
    """Records each torch.distributed collective called while a part runs: (op, elements, reduce op),
    and the GPU indices the part asked for. Each call is also written, before it is made, as a line
    of `progress` (a file the world's supervisor reads after it kills a hung world): what a rank
    waits in survives the rank."""

    def __init__(self, progress: str = ""):
        self.calls = None
        self.devices = None
        self.progress = progress
        self.part = ""
        self.inside = False
        self.scaled = False    # a scaled world's (see the module docstring)
        self.targets = None    # ... and where the part's moves lay in its calls, if placed
        self.moved = 0         # the part's moving collectives so far
        self.budget = {}       # how many more of the values handed to each kind of them to read
        self.stride, self.streamed = 1, {}   # every stride-th kept; how many of each kind read so far

    def install(self) -> None:
        """This recorder is the rank's: every collective's wrapper and kernel hands it the call."""
        wrap_collectives()   # done already where the process was forked from the zygote
        collectives.route()
        collectives.RECORDER = self

    def call(self, name: str, entry: str, original, args: tuple, kwargs: dict):
        """Make one collective's call `original(*args, **kwargs)`, reached as `entry`: recorded as
        `name` while a part runs, its result scaled in a scaled world."""
        if self.inside or self.calls is None:
            # torch hands a collective to the active TorchFunctionMode (CudaOnCpu), which calls
            # the module's function, its wrapper, again; the function calls its group's method, the
            # method the dispatcher's op (grader.rerun.rank.collectives.route): one call, recorded once.
            return original(*args, **kwargs)
        given = args[1:] if entry == METHOD else args   # a method's first is its process group
        recorded = None
        if len(self.calls) < 1000:
            values = functional_numel(name, given) if entry == OP else object_numel(given, kwargs) \
                if name == "all_gather_object" else numel(list(given) + list(kwargs.values()))
            self.calls.append({"op": name, "numel": values,
                               "reduce_op": reduce_name(reduce_op(name, entry, given, kwargs))})
            recorded = self.calls[-1]
            self._note_progress(recorded)
            if self.budget.get(collectives.FAMILY.get(name), 0) > 0:
                self._note_sent(recorded, collectives.FAMILY[name], collectives.handed(name, entry, given, kwargs))
        self.inside = True
        try:
            result = original(*args, **kwargs)
            if self.scaled and name in SCALED:
                self._scale_result(name, entry, result, given, kwargs, len(self.calls) - 1 if recorded else None)
            return result
        except BaseException:
            if recorded is not None:   # it failed inside the collective (a peer gone, a timeout): not raised by the code
                recorded["raised"] = True
            raise
        finally:
            self.inside = False

    def _note_sent(self, call: dict, family: str, handed: list) -> None:
        """The values the rank handed a moving collective (`handed`, its tensors), as far as the
        part's budget for its kind of collective goes: every `stride`-th of them, counted over
        everything the part handed that kind (float32, base64: grader.verdict.carried)."""
        kept, at, left = [], self.streamed.get(family, 0), self.budget[family]
        for tensor in handed:
            n = min(tensor.numel(), left)
            if n <= 0 or not tensor.is_contiguous() and tensor.numel() > left:
                left = 0   # flattening it would copy all of it (an expanded tensor's, say): past the budget anyway
                break
            flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1)
            kept.append(flat[(-at) % self.stride:n:self.stride].to(torch.float32))
            at, left = at + n, left - n
        self.streamed[family], self.budget[family] = at, left
        if kept:
            call["sent"] = base64.b64encode(torch.cat(kept).numpy().tobytes()).decode("ascii")

    def _scale_result(self, name: str, entry: str, result, given: tuple, kwargs: dict, index) -> None:
        """Multiply what a moving collective returned by the part's next factor, once it is done: all
        of it, or where the grader placed the part's moves (`targets`: the values at those runs of
        the `index`-th call, none of a call not placed)."""
        if entry == OP:   # what the op returns, its collective perhaps still running
            for tensor in result if isinstance(result, (list, tuple)) else [result]:
                torch.ops._c10d_functional.wait_tensor(tensor)
            written = result
        else:
            # A Work (async_op=True, every group method's, every c10d op's, there boxed): done once
            # waited for.
            for work in result if isinstance(result, tuple) else [result]:
                if isinstance(work, torch.ScriptObject):
                    work = Work.unbox(work)
                if hasattr(work, "wait"):
                    work.wait()
            written = output(given, kwargs)
        scale_placed(written, SCALES[self.moved % len(SCALES)], self.targets, name, index)
        self.moved += 1

    def _note_progress(self, call: dict) -> None:
        if not self.progress:
            return
        self._write_progress(json.dumps({"part": self.part, "n": len(self.calls), **call}) + "\n", os.O_APPEND)

    def _write_progress(self, line: str, mode: int) -> None:
        """Append `line` (os.O_APPEND) or start the file anew (os.O_TRUNC). Never waits: a FIFO the
        hand-in put in the file's place (it can where a rank has no view of its own) is passed by."""
        try:
            fd = os.open(self.progress, os.O_WRONLY | os.O_CREAT | mode | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         0o600)
        except OSError:
            return   # the record only ever describes a hang; the part goes on without it
        try:
            os.write(fd, line.encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    def asked_for(self, device) -> None:
        index = cuda_index(device)
        if index is not None and self.devices is not None and len(self.devices) < 100:
            self.devices.append(index)

    @contextlib.contextmanager
    def recording(self, calls: list, devices: list = None, part: str = "", scaled: bool = False, budget=None,
                  stride: int = 1, targets: dict = None):
        """Record the part's calls into `calls` (and the GPUs it asks for into `devices`); `budget`: how
        many of the values it hands each kind of moving collective to read, every `stride`-th of
        them kept (grader.parts.sent_budget and sent_stride); `targets`: in a scaled world, where
        this rank's calls carried the part's moves (grader.verdict.carried.targets), or None."""
        self.calls, self.devices, self.part, self.targets = calls, devices, part, targets
        self.scaled, self.moved, self.budget, self.stride, self.streamed = scaled, 0, dict(budget or {}), stride, {}
        if self.progress:
            self._write_progress("", os.O_TRUNC)   # the file holds the current part's calls only
        try:
            yield calls
        finally:
            self.calls = self.devices = self.targets = None
            self.scaled = False
