"""What runs inside one rank of a re-run world: load the hand-in's code, run the parts it is told to, report.

The rank joins a gloo world over a file store, loads `assignment4.py` next to the trusted
`utils.py`, and then waits on its data pipe for the supervisor's orders: for each Run it sets the
check's configuration on the module, serves its own view of the part's data (grader.rerun.wire.secret)
through `utils.create_batch`, and runs what the part's record says it runs at the check's kind
(grader.parts: `runs`): at a step, its function called with `seed=` (the check's, or a seed of the
rank's own where the part's layout draws one), `device="cpu"` and the part's `arguments`; at a
backward check, its layer or block alone. It sends the tensors that returns (with the Run's token,
the collectives the part called and any error) over its result pipe (grader.rerun.wire.protocol),
each held to the part's bounds (grader.rerun.wire.bounds). It never compares anything: the
verdict is the grader's, in the grader's own process, and nothing said here is believed but the
tensors, which only the part's work makes right.
Tracebacks keep the hand-in's own frames only (assignment4.py and utils.py, by file name).

Hand-ins written to the handout word for word must run unchanged on a CPU-only machine:
- the script's set-up runs and its script does not: top-level statements that call a part, print,
  exit or loop, or read what those bind, are left out; imports, definitions, and the assignments,
  calls, `if`s and `try`s of the set-up are run (grader.rerun.rank.source), under the script's
  name alone as its command line;
- "cuda" devices, `.cuda()` and `torch.cuda.set_device` land on the CPU (grader.rerun.rank.hooks); the
  GPU index asked for is reported, for the multi-node check's LOCAL_WORLD_SIZE;
- the world's process group, joined before any hand-in code runs, is the one code that sets up or
  tears down its own gets (grader.rerun.rank.hooks.keep_the_world).
"""

import datetime
import errno
import inspect
import io
import json
import os
import sys
import time
import traceback
import types

import torch
import torch.distributed as dist

from grader.parts import BY_ID, OWN_SIZES, kind_of, sent_budget, sent_stride
from grader.rerun.wire import bounds, protocol, secret
from grader.rerun.sandbox import environment
from grader.rerun.rank.errors import collective_failed, said, text_of
from grader.rerun.rank.source import compile_assignment, compile_source, from_blob, run_module
from grader.rerun.rank import collectives
from grader.rerun.rank import store as rendezvous
from grader.rerun.rank.hooks import CommRecorder, CudaOnCpu, disarm_cuda_calls, keep_the_world, wrap_collectives
from grader.rerun.wire.protocol import ErrorInfo, RankStatus

def warm_up() -> None:
    """Take one tiny SGD step, so that the first step's lazy imports (hundreds of modules) are paid
    once in the process ranks are forked from, not again in every rank, and route every collective
    through the spy there too (collectives.route, hooks.wrap_collectives: about 1 ms a rank, once
    there). Single-threaded: a process that forks must not have started a thread pool."""
    import torch.nn as nn
    import torch.optim as optim
    torch.set_num_threads(1)
    with CudaOnCpu():
        layer = nn.Linear(3, 2, bias=False)
        optimizer = optim.SGD(layer.parameters(), lr=0.5)
        loss = nn.MSELoss(reduction="mean")(layer(torch.randn(4, 3)), torch.randn(4, 2))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    collectives.route()
    wrap_collectives()


def prepare(job: protocol.WorldJob) -> dict:
    """What every rank of a world needs and may share, done once before the ranks are forked: the
    trusted utils loaded, the hand-in's code compiled (never run: that is for the ranks), both as an
    earlier world compiled them where the job brings that (grader.rerun.compiled). The code's
    folder joins the path in the ranks only (rank_main): nothing the leader imports later can come
    from a folder hand-in code runs beside."""
    path, utils_path = os.path.join(job.code_dir, "assignment4.py"), os.path.join(job.code_dir, "utils.py")
    kept = _kept(job, path, utils_path)
    utils = kept[2] if kept else compile_source(utils_path)   # the trusted copy
    run_module("utils", utils, utils_path)
    try:
        code, skipped = kept[:2] if kept else compile_assignment(path)
        return {"path": path, "code": code, "skipped": skipped, "utils": utils, "error": None}
    except BaseException as e:  # noqa: BLE001 - a syntax error is the hand-in's, reported by every rank
        return {"path": path, "code": None, "skipped": [], "utils": utils, "error": said(e, job.code_dir)}


def _kept(job: protocol.WorldJob, path: str, utils_path: str):
    """(code, lines skipped, utils code) as an earlier world compiled the world's files, where the
    job brings that (grader.rerun.rank.source.from_blob); None where it does not, or brings
    something else (both are compiled again)."""
    try:
        return from_blob(job.compiled, path, utils_path) if job.compiled else None
    except ValueError:
        return None


def layout(check: dict, rank: int, world_size: int) -> tuple:
    """(node, local rank, ranks per node) of `rank` when the world is laid out as check["nodes"] nodes."""
    per_node = world_size // max(1, int(check.get("nodes", 1)))
    return rank // per_node, rank % per_node, per_node


def configure(module, check: dict, rank: int, world_size: int, seed: int = None) -> None:
    """Set the check's configuration on the module, and the globals handout-style code reads
    (`seed`: the seed the part is called with, where it is not the check's: Part 5's step)."""
    values = {k: check[k] for k in ("global_batch_size", "input_dim", "output_dim", "seed",
                                    "accumulation_steps", "hidden_dim", *OWN_SIZES) if k in check}
    node, local_rank, per_node = layout(check, rank, world_size)
    values.update(world_size=world_size, rank=rank, local_rank=local_rank, local_world_size=per_node,
                  local_batch_size=check["global_batch_size"] // world_size)
    if seed is not None:
        values["seed"] = seed
    for name, value in values.items():
        setattr(module, name, value)


def _kwargs_for(function, wanted: dict) -> dict:
    """What of `wanted` `function` takes by keyword: all of it where it takes **kwargs."""
    if type(function) is types.FunctionType and not hasattr(function, "__wrapped__") and \
            not hasattr(function, "__signature__"):   # a plain def: its code says, as inspect would, in a tenth of the time
        code = function.__code__
        if code.co_flags & inspect.CO_VARKEYWORDS:
            return wanted
        names = code.co_varnames[code.co_posonlyargcount:code.co_argcount + code.co_kwonlyargcount]
        return {k: v for k, v in wanted.items() if k in names}
    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return wanted
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return wanted
    return {k: v for k, v in wanted.items() if k in params and params[k].kind != params[k].POSITIONAL_ONLY}


def run_part(module, part_id: str, check: dict, comm: CommRecorder, view: secret.Served) -> protocol.Result:
    """Call one part on this rank's `view` of its data (its batch is served through create_batch, a
    backward check's layer is handed `view.data`); return its Result (ok / not_implemented /
    crashed / dist_error / oom)."""
    part = BY_ID[part_id]
    function = getattr(module, part.function, None)
    if not callable(function):
        return protocol.Result(part=part_id, status=RankStatus.CRASHED,
                               error=ErrorInfo(f"assignment4.py has no function {part.function}()"))
    wanted = {"seed": view.seed, "device": "cpu", **{key: check[key] for key in part.arguments}}
    run = part.runs[kind_of(check)]
    calls, devices = [], []

    def call():   # the part's function, with the arguments it takes of `wanted`
        return function(**_kwargs_for(function, wanted))

    started = time.monotonic()
    result = protocol.Result(part=part_id, status=RankStatus.OK)
    try:
        targets = json.loads(check.get("targets") or "{}").get(part_id)
        with CudaOnCpu(comm), comm.recording(calls, devices, part_id, scaled=bool(check.get("scaled")),
                                                    budget=sent_budget(part_id, check, dist.get_world_size()),
                                                    stride=sent_stride(part_id, check, dist.get_world_size()),
                                                    targets=targets and {"families": targets["families"],
                                                                         "calls": targets["calls"].get(str(dist.get_rank()), {})}):
            tensors = run(module, call, check, view.data)
        # Its answer first (the weight, or the output of a layer run alone), refused past what the
        # part may return, then the rest.
        first = next(iter(tensors))
        result.weight = bounds.encode(tensors.pop(first), part_id, check)
        result.extra = {name: bounds.encode(t, part_id, check) for name, t in tensors.items()}
    except bounds.TooLarge as e:   # the grader says so, in its own words (grader.rerun.check)
        result.status, result.weight, result.extra, result.oversize = RankStatus.CRASHED, None, {}, e.values
    except NotImplementedError as e:
        result.status, result.error = RankStatus.NOT_IMPLEMENTED, said(e)
    except MemoryError as e:
        result.status, result.error = RankStatus.OOM, said(e)
    except RuntimeError as e:
        out_of_memory = any(s in text_of(e) for s in ("can't allocate memory", "Cannot allocate memory"))
        result.status = RankStatus.OOM if out_of_memory else \
            RankStatus.DIST_ERROR if collective_failed(e) else RankStatus.CRASHED
        result.error = said(e)
    except BaseException as e:  # noqa: BLE001 - a hand-in may raise anything, SystemExit included
        # ENOMEM: the world's cgroup refused a page (a file in memory, a socket buffer), as its kill would
        result.status = RankStatus.OOM if isinstance(e, OSError) and e.errno == errno.ENOMEM else \
            RankStatus.DIST_ERROR if collective_failed(e) else RankStatus.CRASHED
        result.error = said(e)
    result.comm = calls[:bounds.COMM]
    result.devices = devices[:bounds.DEVICES]
    result.seconds = round(time.monotonic() - started, 4)
    return result


def _clean_environment(job: protocol.WorldJob, rank: int) -> None:
    """Nothing of the grader's environment (a TA's tokens, say) reaches the hand-in, but the
    interface gloo is told to use (loopback unless the grader was told otherwise) and what makes
    the Python itself work (a cluster's module Python needs LD_LIBRARY_PATH, PYTHONPATH). Every
    thread pool has one thread, no GPU is visible (grader.rerun.sandbox.environment). The rank's place in the
    world is set as torchrun sets it on each node (and Slurm's node id, on several nodes)."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    kept = environment.python_variables()
    node, local_rank, per_node = layout(job.check, rank, job.world_size)
    os.environ.clear()
    os.environ.update(kept, **environment.ENVIRONMENT)
    os.environ.update(PATH="/usr/local/bin:/usr/bin:/bin", HOME="/tmp", TMPDIR="/tmp", LANG="C.UTF-8",
                      GLOO_SOCKET_IFNAME=interface, RANK=str(rank),
                      LOCAL_RANK=str(local_rank), WORLD_SIZE=str(job.world_size),
                      LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(node),
                      GROUP_WORLD_SIZE=str(job.world_size // per_node),
                      MASTER_ADDR="127.0.0.1", A4_BACKEND="gloo", A4_TIMEOUT_S=str(job.pg_timeout))
    if per_node < job.world_size:
        os.environ.update(SLURM_NODEID=str(node), SLURM_NNODES=str(job.world_size // per_node),
                          SLURM_PROCID=str(node), SLURM_LOCALID="0")


def _unbuffered_output() -> None:
    """stdout and stderr written at each call: a hung rank is killed, and what its Python buffered
    would be lost with it, the very lines a student prints to find where it hangs."""
    for name in ("stdout", "stderr"):
        raw = open(getattr(sys, name).fileno(), "wb", buffering=0, closefd=False)
        setattr(sys, name, io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", write_through=True))


def _join(job: protocol.WorldJob, rank: int, report, store_port: int) -> bool:
    """Join the world's gloo process group (grader.rerun.rank.store); report Joined, or InfraError (then False)."""
    try:
        store = rendezvous.join(rank, job.world_size, store_port, job.store, job.pg_timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=job.world_size,
                                timeout=datetime.timedelta(seconds=job.pg_timeout))
    except Exception as e:  # noqa: BLE001 - nothing of the hand-in has run yet
        report(protocol.InfraError(error=said(e)))
        return False
    report(protocol.Joined())
    return True


def _load(job: protocol.WorldJob, prepared: dict, report):
    """Run the hand-in's code (Loading, then Ready or LoadFailed); its module, or None."""
    if job.code_dir not in sys.path:
        sys.path.insert(0, job.code_dir)   # as a script's own folder is, for the hand-in's imports
    sys.argv = [prepared["path"]]   # as torchrun runs it, with no argument: argparse's defaults hold
    report(protocol.Loading())
    try:
        if prepared["error"]:
            report(protocol.LoadFailed(error=prepared["error"]))
            return None
        with CudaOnCpu():
            module = run_module("assignment4", prepared["code"], prepared["path"])
    except BaseException as e:  # noqa: BLE001
        report(protocol.LoadFailed(error=said(e)))
        return None
    report(protocol.Ready(skipped_lines=prepared["skipped"]))
    return module


def _run_order(module, order: protocol.Run, job: protocol.WorldJob, rank: int, comm: CommRecorder,
               served: dict) -> protocol.Result:
    """One Run: this rank's view of the part's data served (grader.rerun.wire.secret), the part called."""
    torch.set_num_threads(1)  # one compute thread per rank, whatever the last part set
    try:
        view = secret.rank_view(order, job.check, rank)
    except Exception as e:  # noqa: BLE001 - the data pipe is the hand-in's to break once it has run
        result = protocol.Result(part=order.part, status=RankStatus.CRASHED, error=said(e))
    else:
        configure(module, job.check, rank, job.world_size, view.seed)
        served["data"] = view
        result = run_part(module, order.part, job.check, comm, view)
    served["data"] = None
    result.part, result.token = order.part, order.token
    return result


def _serve(module, job: protocol.WorldJob, rank: int, comm: CommRecorder, served: dict, data_fd: int,
           report) -> None:
    """Run each part the supervisor orders, a Result for each, until its world ends it (returns if
    the supervisor is gone); ends the process after a collective failed."""
    while True:
        order = protocol.receive(data_fd, protocol.ORDERS)
        if not isinstance(order, protocol.Run):
            return   # the supervisor is gone
        result = _run_order(module, order, job, rank, comm, served)
        report(result)
        if result.status == RankStatus.DIST_ERROR:
            os._exit(0)


def rank_main(job: protocol.WorldJob, rank: int, result_fd: int, prepared: dict = None, data_fd: int = 4,
              store_port: int = 0) -> None:
    """The whole life of one rank. Never returns: the process ends with os._exit. `store_port`: the
    world's TCP store's (grader.rerun.rank.store; 0: its file store, under torchrun).

    Messages: Joined (gloo is up), then, once Load is read from `data_fd` (every rank has joined),
    Loading (the hand-in's code runs from here on), Ready, then a Result per Run read from
    `data_fd`, until the world ends it."""
    me = os.getpid()

    def report(message):
        # A process the hand-in forked inherits the pipe and comes back through this code: only the
        # rank itself reports, so no copy of it can put messages out of order.
        if os.getpid() != me:
            os._exit(0)
        protocol.send(result_fd, message)

    try:
        torch.set_num_threads(1)
        _clean_environment(job, rank)
        _unbuffered_output()
        if not _join(job, rank, report, store_port):
            os._exit(0)
        comm = CommRecorder(progress=os.path.join(job.work_dir, f"rank{rank}.calls"))
        comm.install()
        disarm_cuda_calls(comm)
        keep_the_world()
        prepared = prepared or prepare(job)
        served = {"data": None}   # the part's data create_batch hands out (secret.serve_batches)
        secret.serve_batches(served)
        if not isinstance(protocol.receive(data_fd, protocol.ORDERS), protocol.Load):
            os._exit(0)   # the world ends before its code runs (another rank's join failed)
        module = _load(job, prepared, report)
        if module is None:
            os._exit(0)
        _serve(module, job, rank, comm, served, data_fd, report)
    except BaseException:  # noqa: BLE001 - the pipe may be gone; the supervisor sees the exit
        traceback.print_exc()
        os._exit(3)
    os._exit(0)
