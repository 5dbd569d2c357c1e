"""Read a run's .log in the tests of the Slurm kit (grader.logs will take its place).

Lines are found anywhere in the text, not only at line starts, so that a line another rank's
output was spliced into is still found.
"""

import re
from dataclasses import dataclass, field

PARTS = ("Baseline", "GradAccumulation", "DataParallel", "FullColumnParallel")
# The keys of slurm/common.sh's [Job] header, in order: every run (sbatch, submitit, run-local.sh).
HEADER_KEYS = ["id", "name", "started", "nodes", "nnodes", "nproc_per_node", "world_size", "backend",
               "torch", "nccl", "python"]

_HEADER = re.compile(r"^\[Job\] (?P<body>(?!finished)\S+=.*)$", re.M)
_FOOTER = re.compile(r"^\[Job\] finished status=(?P<status>-?\d+) at=\S+$", re.M)
_INIT = re.compile(r"\[Distributed Init\] Rank (?P<rank>\d+) initialized on node (?P<node>\S+) "
                   r"\((?P<host>[^)]*)\) on (?P<device>\S+) \| backend (?P<backend>\w+) \| "
                   r"world size (?P<world>\d+) \|")
_MATCH = re.compile(r"\[(?P<part>\w+)\]\[Rank (?P<rank>\d+)\] Tensors match: (?P<ok>True|False)")
_DONE = re.compile(r"\[Rank (?P<rank>\d+)\] done")


@dataclass
class JobLog:
    header: dict = field(default_factory=dict)    # key -> value, from every "[Job] k=v ..." line
    header_keys: list = field(default_factory=list)
    footer_status: int | None = None              # None: the run was killed before its end
    hosts: dict = field(default_factory=dict)     # rank -> host, from the init lines
    backends: set = field(default_factory=set)
    world_sizes: set = field(default_factory=set)
    matches: dict = field(default_factory=dict)   # part -> {rank: bool}
    done: set = field(default_factory=set)

    def all_parts_match(self, world_size: int) -> bool:
        ranks = set(range(world_size))
        return all(self.matches.get(p, {}).keys() == ranks and all(self.matches[p].values()) for p in PARTS)


def parse(text: str) -> JobLog:
    log = JobLog()
    for m in _HEADER.finditer(text):
        for key, value in re.findall(r"(\w+)=(\S+)", m["body"]):
            log.header[key] = value
            log.header_keys.append(key)
    footer = _FOOTER.search(text)
    log.footer_status = int(footer["status"]) if footer else None
    for m in _INIT.finditer(text):
        log.hosts[int(m["rank"])] = m["host"]
        log.backends.add(m["backend"])
        log.world_sizes.add(int(m["world"]))
    for m in _MATCH.finditer(text):
        log.matches.setdefault(m["part"], {})[int(m["rank"])] = m["ok"] == "True"
    log.done = {int(m["rank"]) for m in _DONE.finditer(text)}
    return log
