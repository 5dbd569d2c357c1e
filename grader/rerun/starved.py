"""Whether a part that ran past its clock hung, or its world was kept from the CPU.

A batch's part clock is a multiple of what the reference needed on this machine when the batch
began (grader.limits.part_clock). A part past that clock either did not finish the work (a loop
that never ends, a rank asleep, a collective no peer joins) or was not given the CPU to do it
(the machine grew busy). The kernel keeps, for each thread, the time it ran and the time it was
ready to run but waited for a CPU (/proc/PID/task/TID/schedstat, in nanoseconds: run, wait,
slices). At a part's timeout the world's leader adds them up over every thread of its ranks
(`cpu_time`), and the grader decides (`starved`):

    starved  =  (busy   and   wait >= clock x min(ranks, cores) / 4
                        and   (run < clock x min(ranks, cores) / 4   or   wait >= KEPT_OUT x run))
                or   (disk > 0   and   short)

Both times are sums over the ranks, measured against what the world could have used at once:
`min(ranks, cores)` CPUs for the clock; a rank's wait is its thread's that waited most, since
threads a rank makes queue behind each other on cores the world has anyway (dozens of threads of
its own would otherwise read as a machine that kept them out). Ranks that each waited a few tenths
of a second to start a part and then slept are not starved by it, however many ranks add their
waits up.

- a rank asleep, or waiting in a collective: it neither runs nor waits for the CPU. Not starved,
  however long it waited before it fell asleep (threads that queued at load, or in the part
  before): `busy` says whether its threads ran or were ready to in a short window (WINDOW) after
  the timeout, for at least half of it.
- a loop that never ends: it runs (with more ranks than cores its ranks wait for each other, and
  beside another world of the batch for that one too, but they ran at least a quarter of what the
  cores could give them: half of it on a machine that holds two such worlds). Not starved.
- a correct part on a machine whose cores something else took: its ranks waited for the CPU and
  ran little. Starved: the grader runs the part again on the rubric's own clock, and that run
  decides (grader.pipeline.grade.judge_check).
- a machine so busy that the world's leader itself got the CPU late, after the clock: its ranks
  went on running meanwhile, past a quarter of the cores' clock, but waited KEPT_OUT times as long
  as they ran (a world given an eighth of what it asked for, or less). Starved.
- a rank waiting for the disk (a thread in state D at the timeout: pages of torch read back on a
  machine short of memory) neither runs nor waits for a CPU, and is not the code's fault either:
  `disk` counts those threads, and one is enough to run the part again where the machine was
  short of memory then (`short`: tasks stalled on memory in the last ten seconds, by the kernel's
  pressure stall information, or less than a tenth of it available where the kernel keeps none).
  Code can put its own thread in state D (a vfork whose child sleeps) at will: on a machine with
  memory to spare, that is its own wait, and the clock stands; so is it where the world's own
  cgroup is at its limit (code that reads files past it stalls on its own reclaim, which the
  machine's record counts too).

A rank that never read the part's order from its pipe (the hand-in stalled it after the part
before) never ran the part: that timeout is neither, and the part runs again alone, as any failure
does (grader.rerun.supervise notes those ranks, `Abort.unread`).

Where the kernel does not keep these times (no /proc, a kernel without schedstats) or a rank's
cannot be read (not a thread that ended as they were read: it is passed by), the world counts as
starved: the part is run again, as if the clock had said
nothing, and the grader's report says so (`SOURCE`).
"""

import os
import time
from typing import Optional

from grader.rerun.wire.protocol import CpuTime

SOURCE = "/proc/self/schedstat"
KEPT_OUT = 8   # waited this many times as long as it ran: kept from the CPU, whenever the times were read
READABLE = os.path.exists(SOURCE)


def cpu_time(pids: list, cgroups: list = ()) -> Optional[CpuTime]:
    """The time every thread of processes `pids` (as this /proc numbers them) ran, and the time each
    of them waited for a CPU, in seconds (by its thread that waited most: its own threads queued
    behind each other are not the machine's doing), and the cores this process may use; then, WINDOW
    later, how much of that window its threads were running or ready to (`busy`: none, for threads
    asleep however long they waited before). None where one of them cannot be read. A thread that
    ended meanwhile is passed by. `cgroups`: the world's, whose memory at its limit makes its stalls
    its own, not the machine's (`short`)."""
    first = _threads(pids)
    if first is None:
        return None
    time.sleep(WINDOW)
    then = _threads(pids)
    if then is None:
        return None
    run = sum(ran for ran, _, _ in first.values())
    wait = sum(max([0] + [waited for (pid, _), (_, waited, _) in first.items() if pid == p]) for p in pids)
    busy = sum(sum(then[t][:2]) - sum(first[t][:2]) for t in then.keys() & first.keys())
    disk = sum(state == b"D" for _, _, state in first.values())
    return CpuTime(run=round(run / 1e9, 3), wait=round(wait / 1e9, 3), cores=len(os.sched_getaffinity(0)), disk=disk,
                   short=bool(disk) and short_of_memory() and not at_its_limit(cgroups), busy=round(busy / 1e9, 3))


WINDOW = 0.1   # seconds between the two readings of a world's threads at a timeout


def _threads(pids: list) -> Optional[dict]:
    """(pid, tid) -> (ns run, ns waited for a CPU, state) of every thread of `pids` now; None where
    none are given or one of them cannot be read (a thread that ended as it was read is passed by)."""
    if not pids:
        return None
    found = {}
    try:
        for pid in pids:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                        ran, waited = f.read().split()[:2]
                    with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                        state = f.read().rsplit(b")", 1)[1].split()[0]
                except (FileNotFoundError, ProcessLookupError):
                    continue   # the thread ended since the folder was listed
                found[pid, tid] = (int(ran), int(waited), state)
    except (OSError, ValueError, IndexError):
        return None
    return found


def at_its_limit(cgroups: list) -> bool:
    """Whether a world's memory cgroup holds nearly all it may (FULL of memory.max, v2, or of
    memory.limit_in_bytes, v1, page cache too): memory stalls then are the world reclaiming its own
    pages (code that reads files past its limit), which the machine-wide record counts too."""
    for folder in cgroups:
        for used, limit in (("memory.current", "memory.max"), ("memory.usage_in_bytes", "memory.limit_in_bytes")):
            try:
                with open(os.path.join(folder, used)) as f, open(os.path.join(folder, limit)) as g:
                    if int(f.read()) >= FULL * int(g.read()):
                        return True
            except (OSError, ValueError):   # no such file here (the other version's), or "max"
                continue
    return False


FULL = 0.9
PRESSURE, STALLED = "/proc/pressure/memory", 1.0   # percent of the last 10 s some task stalled on memory


def short_of_memory() -> bool:
    """Whether the machine is short of memory now: tasks stalled on it in the last ten seconds
    (PSI's `some avg10`), or, where the kernel keeps no such record, under a tenth of it available."""
    try:
        with open(PRESSURE) as f:
            some = f.readline().split()
        return float(dict(field.split("=") for field in some[1:])["avg10"]) >= STALLED
    except (OSError, ValueError, KeyError, IndexError):
        pass
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) for line in f if line.split()[1:2] != []}
        return info["MemAvailable"] < info["MemTotal"] / 10
    except (OSError, ValueError, KeyError, IndexError):
        return True   # nothing says: as when the times themselves cannot be read


def starved(cpu: Optional[CpuTime], clock: float, ranks: int) -> bool:
    """Whether a world whose part ran past `clock` seconds was kept from the CPU (see the module
    docstring); True where its times are unknown (`cpu` is None)."""
    if cpu is None:
        return True
    share = clock * min(ranks, max(cpu.cores, 1)) / 4   # a quarter of what the world could use at once
    wants = cpu.busy is None or cpu.busy >= WINDOW / 2   # still at work: not asleep since, whatever it waited before
    return (wants and cpu.wait >= share and (cpu.run < share or cpu.wait >= KEPT_OUT * cpu.run)) or \
        (cpu.disk > 0 and cpu.short)


def said(cpu: Optional[CpuTime]) -> str:
    """What a timeout's message says of the world's CPU time."""
    if cpu is None:
        return f"its ranks' CPU time could not be read ({SOURCE})"
    disk = f", {cpu.disk} thread{'s' if cpu.disk > 1 else ''} waiting for the disk" if cpu.disk else ""
    return f"its ranks ran {cpu.run:g} s and waited {cpu.wait:g} s for a CPU, on {cpu.cores} cores{disk}"
