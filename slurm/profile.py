"""Cluster profiles: what differs from one Slurm cluster to the next, one YAML file per cluster.

    partition: gpu
    account: my-course
    gpus_per_node: 4
    cpus_per_task: 16
    time: "00:15:00"
    setup:
      - module load cuda/12.4
      - source $HOME/a4/.venv/bin/activate

`load_profile(path)` reads and validates one; every key is optional (the defaults are those of
slurm/assignment4.sbatch). It is validated by the kit's one typed-YAML mechanism (grader/typed.py,
as the rubric and the course policy are): a bad file raises `ProfileError` with a message that
names the file, the key, what would be valid and what the key is for. `slurm/clusters/` holds a
generic example and the profile of the local test cluster.
"""

import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from grader import kit, typed

CLUSTERS_DIR = Path(__file__).resolve().parent / "clusters"

_TIME = re.compile(r"^(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")


class ProfileError(ValueError):
    """A cluster profile that cannot be used; the message says which file, which key and why."""


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("a non-empty text, or nothing")
    return value.strip()


def _at_least(lowest: int):
    def check(value: int) -> int:
        if value < lowest:
            raise ValueError(f"a whole number >= {lowest}")
        return value
    return check


def _time(value):
    _minutes(value)
    return value


def _sbatch_options(value: dict) -> dict:
    if not all(k and not k.startswith("-") for k in value):
        raise ValueError("a mapping of sbatch option names (without '--') to values")
    return value


@dataclass(frozen=True)
class ClusterProfile:
    """One cluster's Slurm settings. The defaults are those of slurm/assignment4.sbatch."""

    partition: str | None = field(default=None, metadata={
        "check": _text, "help": "Slurm partition (sbatch --partition); empty: the cluster's default partition"})
    account: str | None = field(default=None, metadata={
        "check": _text, "help": "account the job is charged to (sbatch --account); empty: your default account"})
    gpus_per_node: int = field(default=4, metadata={
        "check": _at_least(0), "help": "GPUs per node (sbatch --gpus-per-node); 0 runs on the CPUs with gloo"})
    nproc_per_node: int | None = field(default=None, metadata={
        "check": _at_least(1), "help": "ranks (processes) per node; empty: one per GPU, or 1 when gpus_per_node is 0"})
    cpus_per_task: int = field(default=8, metadata={
        "check": _at_least(1), "help": "CPU cores for each node's torchrun and its ranks (sbatch --cpus-per-task)"})
    time: int | str = field(default="00:15:00", metadata={
        "check": _time, "help": "wall-clock limit: minutes, or [D-]HH:MM:SS as sbatch --time takes it"})
    setup: tuple[str, ...] = field(default=(), metadata={
        "help": "shell lines the job runs before starting Python (module load ..., source .../activate), "
                "one '- line' each"})
    python: str | None = field(default=None, metadata={
        "check": _text, "help": "command that runs Python on the nodes; empty: the Python running the launcher "
                                "(for a container: apptainer exec --nv a4.sif python)"})
    sbatch_options: dict[str, int | str] = field(default_factory=dict, metadata={
        "check": _sbatch_options, "help": "further sbatch options, without dashes: {qos: normal, constraint: a100}"})
    description: str = field(default="", metadata={"help": "what this profile is for, for people"})

    @property
    def time_minutes(self) -> int:
        """The time limit in whole minutes, rounded up as Slurm rounds it."""
        return _minutes(self.time)

    @property
    def ranks_per_node(self) -> int:
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        return self.gpus_per_node if self.gpus_per_node > 0 else 1

    @property
    def backend(self) -> str:
        return "nccl" if self.gpus_per_node > 0 else "gloo"

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def profile_keys() -> dict:
    """{key: (default, help)} for every key a profile may have."""
    out = {}
    for f in fields(ClusterProfile):
        default = f.default_factory() if f.default is MISSING else f.default
        out[f.name] = (default, f.metadata["help"])
    return out


def _minutes(value) -> int:
    if isinstance(value, bool):
        raise ValueError("a number of minutes or [D-]HH:MM:SS")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("a positive number of minutes")
        return value
    m = _TIME.match(str(value).strip())
    if not m:
        raise ValueError("a number of minutes or [D-]HH:MM:SS")
    days = int(m["d"] or 0)
    parts = [int(p) for p in (m["a"], m["b"], m["c"]) if p is not None]
    if m["d"] is not None:                     # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 3:                      # H:M:S
        hours, minutes, seconds = parts
    elif len(parts) == 2:                      # M:S
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:                                      # M
        hours, minutes, seconds = 0, parts[0], 0
    total = days * 24 * 60 + hours * 60 + minutes + (1 if seconds else 0)
    if total <= 0:
        raise ValueError("a positive time limit")
    return total


def profile_from_dict(data: dict, source: str = "profile") -> ClusterProfile:
    """Validate `data` (as read from YAML) and build the profile; `source` names it in errors."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: expected a mapping of keys to values at the top level, "
                           f"got {type(data).__name__}; valid keys: {', '.join(profile_keys())}")
    return typed.build(ClusterProfile, data, source, ProfileError, suggest=True)


def resolve_profile_path(name_or_path) -> Path:
    """A path as given, or the name of a profile in slurm/clusters/ ("mycluster" -> clusters/mycluster.yaml)."""
    path = Path(name_or_path)
    if path.exists() or path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        return path
    return CLUSTERS_DIR / f"{name_or_path}.yaml"


def load_profile(name_or_path) -> ClusterProfile:
    """Read and validate a profile; ProfileError names the file and what to do."""
    path = resolve_profile_path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CLUSTERS_DIR.glob("*.yaml")))
        raise ProfileError(f"{path}: no such profile; give a YAML file, or one of the profiles in "
                           f"slurm/clusters/ by name ({known})")
    return profile_from_dict(kit.read_yaml(path, "cluster profile", ProfileError), source=str(path))
