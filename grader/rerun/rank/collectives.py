"""Every way a rank reaches a collective, and what each call's arguments say: its values, its reduce
op, where its result lands. The spy (grader.rerun.rank.hooks.CommRecorder) records and scales each
call by these.

A rank reaches a collective by torch.distributed's functions, by a process group's (or its
backend's) own methods (dist.group.WORLD.allreduce([t]); the functions call them in turn), by the
functional collectives' ops (torch.distributed._functional_collectives, which DTensor uses, return
what they computed), or from C++, where no Python wrapper sees it: DistributedDataParallel's reducer
all-reduces its gradient buckets there (and broadcasts the parameters, all-gathers their shapes),
as a C++ extension may, and an op's overload (torch.ops._c10d_functional.all_reduce.default) is not
its packet. Every one of them ends in one of the dispatcher's ops: c10d's (allreduce_ and its kin,
which a process group's C++ methods call) or the functional collectives'. So besides the Python
wrappers, `route` registers a kernel of the spy's for each such op at AutogradCPU, the key the
dispatcher takes before the CPU's: it hands the call to the rank's recorder (`RECORDER`; a call a
Python wrapper already holds is passed straight on, one call recorded once) and the op goes on below
autograd, to gloo. The kernels are registered once, in the process ranks are forked from; until a
rank sets its recorder they only pass calls on. A call made from C++ under torch.inference_mode()
(which leaves the autograd keys out) is not seen: unrecorded and unscaled, it can fail a part, never
pass one. The functional collectives' autograd ops keep autograd kernels of their own: their Python
wrappers alone see them.
"""

import torch
import torch.distributed as dist

from grader.parts import WHOLE_CALL

# The collectives a part may call; each call is recorded with its element count.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_single",
               "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter_single", "broadcast",
               "reduce", "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv",
               "isend", "irecv", "barrier", "all_gather_object", "broadcast_object_list")

# What a scaled world multiplies the k-th moving collective's output by (k modulo their number).
SCALES = (1.5, 1.25, 1.75, 2.0)
SCALED = ("all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_single",
          "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter_single", "all_gather_object")
# What a part's moves call each (grader.parts.Moves.collective): what the rank hands each is recorded.
FAMILY = {name: "all_reduce" if name == "all_reduce" else "reduce_scatter" if "reduce_scatter" in name else "all_gather"
          for name in SCALED}
OUTPUT_NAMES = ("tensor", "tensor_list", "output_tensor", "output", "output_tensor_list",   # the first argument's names
                "tensors", "output_tensors", "outputTensor", "object_list")

# How a call is reached; whichever way, it is recorded (and scaled) under the function's name.
FUNCTION, METHOD, OP, DISPATCHED = "function", "method", "op", "dispatched"
GROUP_METHODS = {"allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "allgather": "all_gather",
                 "allgather_coalesced": "all_gather", "_allgather_base": "all_gather_into_tensor",
                 "allgather_into_tensor_coalesced": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter",
                 "_reduce_scatter_base": "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
                 "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all_to_all", "alltoall_base": "all_to_all_single",
                 "gather": "gather", "scatter": "scatter", "send": "send", "recv": "recv", "recv_anysource": "recv",
                 "barrier": "barrier"}
FUNCTIONAL_OPS = {"all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_reduce_coalesced": "all_reduce",
                  "all_reduce_coalesced_": "all_reduce", "all_gather_into_tensor": "all_gather_into_tensor",
                  "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
                  "reduce_scatter_tensor": "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
                  "all_to_all_single": "all_to_all_single", "broadcast": "broadcast", "broadcast_": "broadcast"}
# The dispatcher's op each group method calls: its name and an underscore (it works in place), but
# send's and barrier's; recv_anysource's is spelled out.
C10D_OPS = {("recv_any_source" if method == "recv_anysource" else method) + ("" if method in ("send", "barrier") else "_"): name
            for method, name in GROUP_METHODS.items()} | {"monitored_barrier_": "barrier"}

RECORDER = None     # the rank's CommRecorder, once it installs itself: the dispatcher's kernels hand it every call
_LIBRARIES = []     # the kernels' registrations, kept for the process's life


def route() -> None:
    """Register the spy's kernel for every c10d and functional collective op, at AutogradCPU (once
    a process: call it in the process ranks are forked from)."""
    if _LIBRARIES:
        return
    for space, ops, entry in (("c10d", C10D_OPS, DISPATCHED), ("_c10d_functional", FUNCTIONAL_OPS, OP)):
        library = torch.library.Library(space, "IMPL")
        for op, name in ops.items():
            try:
                overload = getattr(getattr(torch.ops, space), op).default
            except (AttributeError, RuntimeError):
                continue   # not in this torch
            library.impl(op, _kernel(name, entry, overload, op), "AutogradCPU")
        _LIBRARIES.append(library)


# NCCL takes all_gather_into_tensor's output, and reduce_scatter_tensor's input, stacked ([p, *shard],
# as torch's documentation shows them) or flat ([p * shard[0], ...]); gloo refuses the stacked form
# ("invalid tensor size"). Code that ran on the cluster's GPUs runs here: the same memory, viewed flat.
STACKED = {"_allgather_base_": 0, "_reduce_scatter_base_": 1}   # c10d op -> which argument is the whole


def flat_for_gloo(op: str, args: tuple) -> tuple:
    """`args` of a c10d op in STACKED, the whole and the shard viewed flat where the whole is the
    shards stacked; else as they are."""
    if len(args) < 2 or not all(isinstance(a, torch.Tensor) for a in args[:2]):
        return args
    whole, shard = args[STACKED[op]], args[1 - STACKED[op]]
    if whole.dim() == shard.dim() + 1 and whole.shape[1:] == shard.shape and whole.is_contiguous() \
            and shard.is_contiguous():
        return (args[0].view(-1), args[1].view(-1)) + tuple(args[2:])
    return args


def _kernel(name: str, entry: str, overload, op: str):
    def below(*args, **kwargs):   # the op itself: gloo's kernel, autograd (which it has none of) left out
        if op in STACKED:
            args = flat_for_gloo(op, args)
        with torch._C._AutoDispatchBelowAutograd():
            return overload(*args, **kwargs)

    def kernel(*args, **kwargs):
        recorder = RECORDER
        if recorder is None:
            return below(*args, **kwargs)
        return recorder.call(name, entry, below, args, kwargs)
    return kernel


def scale(value, factor: float) -> None:
    """Multiply every floating-point tensor of `value` (a tensor, or a list, tuple or dict of them:
    all_gather_object's objects) in place, by its data: no version counter moves, so a tensor
    autograd saved is still its to use."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            value.data.mul_(factor)
    elif isinstance(value, (list, tuple, dict)):
        for item in value.values() if isinstance(value, dict) else value:
            scale(item, factor)


def scale_runs(value, runs: list, factor: float) -> None:
    """Multiply in place, as `scale` does, only the values of `value` (a tensor, or a list or tuple
    of them, end to end) at each run [start, stop, step] of `runs`: every step-th from start, before
    stop (an all-reduce's result lies where what was handed to it did)."""
    tensors = [value] if isinstance(value, torch.Tensor) else \
        [t for t in value if isinstance(t, torch.Tensor)] if isinstance(value, (list, tuple)) else []
    at = 0
    for tensor in tensors:
        n = tensor.numel()
        for start, stop, step in runs if tensor.is_floating_point() else ():
            low, high = max(start, at), min(stop, at + n)
            low += (start - low) % step   # the run's first value at or past `low`
            if low < high:
                flat = tensor.data.view(-1) if tensor.is_contiguous() else tensor.data.reshape(-1)
                flat[low - at:high - at:step].mul_(factor)
                if not tensor.is_contiguous():   # reshape copied it: the values go back in place
                    tensor.data.copy_(flat.view_as(tensor))
        at += n


def scale_placed(value, factor: float, targets, name: str, index) -> None:
    """Scale what the `index`-th call of the part (a call of `name`) returned: where `targets`
    (grader.verdict.carried.targets, this rank's) place the part's moves, in a call of the kinds
    they hold, only the values there (none of a call they do not place, all of one they mark
    WHOLE_CALL); else all of it."""
    if not (targets and FAMILY[name] in targets["families"]):
        return scale(value, factor)
    where = targets["calls"].get(str(index), []) if index is not None else []
    if where == WHOLE_CALL:
        scale(value, factor)
    else:
        scale_runs(value, where, factor)


def output(args: tuple, kwargs: dict):
    """What a moving collective writes its result into: its first argument, by position or by name."""
    if args:
        return args[0]
    return next((kwargs[name] for name in OUTPUT_NAMES if name in kwargs), None)


FIRST_NAMES = ("tensor", "tensors", "input")   # an all-reduce's tensors, a functional op's input, by name
SECOND_NAMES = ("tensor", "input_tensor", "obj", "input_list", "input", "input_tensors")   # a gather's shard...


def handed(name: str, entry: str, given: tuple, kwargs: dict) -> list:
    """What the rank hands a moving collective, its floating-point tensors: an all-reduce's tensors,
    a functional op's input (its first argument); an all-gather's shard, a reduce-scatter's input
    (their second: the first is where the result goes); all_gather_object's object's tensors. Read
    before the call: an all-reduce works in place."""
    first = name == "all_reduce" or entry == OP
    value = given[0 if first else 1] if len(given) > (0 if first else 1) else \
        next((kwargs[n] for n in (FIRST_NAMES if first else SECOND_NAMES) if n in kwargs), None)
    return [t.detach() for t in _tensors(value) if t.is_floating_point()]


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple, dict)):
        return [t for v in (value.values() if isinstance(value, dict) else value) for t in _tensors(v)]
    return []


def numel(value) -> int:
    """The values of the tensors in `value` (a tensor, or a list, tuple or dict of them)."""
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (list, tuple, dict)):
        return sum(numel(v) for v in (value.values() if isinstance(value, dict) else value))
    return 0


def object_numel(given: tuple, kwargs: dict) -> int:
    """all_gather_object(object_list, obj, group)'s values as all_gather(list, shard)'s are
    recorded: the tensors its object holds, p + 1 times (what it sends, what it gets)."""
    obj = given[1] if len(given) > 1 else kwargs.get("obj")
    group = given[2] if len(given) > 2 else kwargs.get("group")
    try:
        size = dist.get_world_size(group)
    except (RuntimeError, ValueError, TypeError):
        size = 1
    return numel(obj) * (size + 1)


def functional_numel(name: str, args: tuple) -> int:
    """A functional collective's values as its function's call is recorded (input and output alike,
    as all_gather_into_tensor(out, shard)): an op is handed its inputs and the group's size only."""
    given = numel(args[0]) if args else 0
    size = next((a for a in args[1:] if isinstance(a, int) and not isinstance(a, bool)), 1)
    if name == "all_gather_into_tensor":
        return given + given * size
    if name == "reduce_scatter_tensor":
        return given + given // max(1, size)
    return 2 * given if name == "all_to_all_single" else given


def reduce_op(name: str, entry: str, given: tuple, kwargs: dict):
    """The reduce op a collective was called with, by how it was reached (by position, an
    all-reduce's only); None where none was given."""
    if entry == DISPATCHED:   # a c10d op's, boxed
        return next((v for v in given if isinstance(v, torch.ScriptObject) and v._type().name() == "ReduceOp"), None)
    if entry == METHOD:   # (tensors, options) or (tensors, op): the options carry their reduceOp
        return next((v for v in list(given[1:]) + list(kwargs.values())
                     if hasattr(v, "reduceOp") or isinstance(v, (dist.ReduceOp, dist.ReduceOp.RedOpType))), None)
    if "op" in kwargs or "reduceOp" in kwargs:
        return kwargs.get("op", kwargs.get("reduceOp"))
    return given[1] if name == "all_reduce" and len(given) > 1 else None


def reduce_name(op):
    """SUM, AVG, MAX...: of a ReduceOp's type, a ReduceOp object (PREMUL_SUM's), a group's options or
    a functional collective's string, a c10d op's boxed ReduceOp."""
    if isinstance(op, torch.ScriptObject):
        return next((name for name, value in dist.ReduceOp.RedOpType.__members__.items() if int(value) == op.op()),
                    str(op.op()))
    op = getattr(op, "reduceOp", op)
    op = getattr(op, "op", op)
    return None if op is None else str(op).rsplit(".", 1)[-1].upper()
