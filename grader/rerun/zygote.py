"""The processes the executors start: `python -m grader.rerun.zygote --zygote MODE` (the warm
executor's helper) or `--torchrun-rank JOB_FILE` (one rank under torchrun).

The zygote imports torch once, takes one tiny step so the lazy imports are paid, freezes its heap,
and then, for each world asked of it, forks a leader that alone reads the job (grader.rerun.world).
"""

import json
import os
import signal
import sys

from grader.rerun import protocol
from grader.limits import Limits


def _zygote(mode: str, kit_root: str, sandbox_name: str) -> None:
    """The warm helper: for each world, fork a leader that reads the job, runs it and reports.

    The zygote itself never reads a job: no check's values are ever in its memory, and so none in
    the memory of the ranks forked after it.
    """
    import gc
    from grader.rerun import sandbox, world, worker  # torch is imported once here, inherited by every rank
    worker.warm_up()
    # Everything alive now is shared with every fork; frozen, no child's garbage collector walks
    # (and so copies) it.
    gc.collect()
    gc.freeze()
    control_out = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray prints must not reach the control pipe
    sandbox.prctl(sandbox.PR_SET_PDEATHSIG, signal.SIGKILL)
    sandbox.prctl(sandbox.PR_SET_DUMPABLE, 0)
    import encodings.idna  # noqa: F401 - a hand-in's socket to "127.0.0.1" needs it; load it once here
    isolation = sandbox.probe(mode, kit_root, sandbox_name)
    protocol.send(control_out, protocol.Hello(isolation=isolation.summary()))
    while True:
        request = protocol.receive(0, (protocol.WorldRequest, protocol.Exit))
        if not isinstance(request, protocol.WorldRequest):
            return
        pid = os.fork()
        if pid == 0:
            job = protocol.receive(0, (protocol.WorldJob,))
            world.lead_world(job, isolation, control_out)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        # Nothing of this world may outlive it: no process, no file in /tmp or /dev/shm.
        sandbox.clean_between_worlds()
        if code != 0:
            # The leader was killed before it could report: say so, so the grader need not wait.
            protocol.send(control_out, world.lost_report(None, f"the world's leader was killed ({code})"))


def _torchrun_rank(job_file: str) -> None:
    from grader.rerun import sandbox, worker
    with open(job_file) as f:
        job = protocol.decode(json.load(f), (protocol.WorldJob,))
    rank = int(os.environ["RANK"])
    fd = os.open(os.path.join(job.work_dir, f"rank{rank}.fifo"), os.O_WRONLY)
    data_fd = os.open(os.path.join(job.work_dir, f"rank{rank}.data"), os.O_RDONLY)
    worker.warm_up()  # on the start-up clock, as the zygote does, not on the first part's
    os.chdir(job.work_dir)
    sandbox.limit_rank(Limits(**job.limits), os.getuid())
    worker.rank_main(job, rank, fd, data_fd=data_fd)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--zygote"] and len(sys.argv) >= 4:
        _zygote(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")
    elif sys.argv[1:2] == ["--torchrun-rank"]:
        _torchrun_rank(sys.argv[2])
    else:
        sys.exit("usage: python -m grader.rerun.zygote --zygote MODE KIT [SANDBOX] | --torchrun-rank JOB_FILE (the grader runs it)")
