"""What a rank's torch is wrapped in while hand-in code runs: GPUs that land on the CPU, and a spy
on every collective a part calls (GRADING-NOTES: a data-parallel step that computes the whole
batch on every rank gives the right weight; only its collectives tell)."""

import contextlib

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

# The collectives a part may call; each call is recorded with its element count.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
               "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast",
               "reduce", "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv",
               "isend", "irecv", "barrier", "all_gather_object", "broadcast_object_list")


def _is_cuda(device) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


class CudaOnCpu(TorchFunctionMode):
    """Every tensor that code asks to put on a GPU stays on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu") + tuple(args[2:])
        return func(*args, **kwargs)


def disarm_cuda_calls() -> None:
    """torch.cuda calls that set up a GPU are no-ops here (there is none)."""
    for name in ("set_device", "synchronize", "empty_cache", "reset_peak_memory_stats"):
        setattr(torch.cuda, name, lambda *args, **kwargs: None)
    torch.cuda.current_device = lambda: 0


def _numel(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (list, tuple)):
        return sum(_numel(v) for v in value)
    return 0


class CommRecorder:
    """Records each torch.distributed collective called while a part runs: (op, elements, reduce op)."""

    def __init__(self):
        self.calls = None

    def install(self) -> None:
        import torch.distributed.distributed_c10d as c10d
        for name in COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapper = self._wrap(name, original)
            for module in (dist, c10d):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapper)

    def _wrap(self, name, original):
        def recorded(*args, **kwargs):
            if self.calls is not None and len(self.calls) < 1000:
                op = kwargs.get("op", args[1] if name == "all_reduce" and len(args) > 1 else None)
                self.calls.append({"op": name, "numel": _numel(list(args) + list(kwargs.values())),
                                   "reduce_op": str(op).rsplit(".", 1)[-1] if op is not None else None})
            return original(*args, **kwargs)
        recorded.__name__ = name
        recorded.__wrapped__ = original
        return recorded

    @contextlib.contextmanager
    def recording(self, calls: list):
        self.calls = calls
        try:
            yield calls
        finally:
            self.calls = None
