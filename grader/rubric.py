"""The rubric: points, re-run configurations, tolerances, timeouts and penalties, from YAML.

`grader/rubric.yaml` is the course's rubric. A rubric file given with `--rubric` is read on top of
it and states only what it changes: its mappings are merged key by key, its lists (the checks)
replace the whole list. Unknown keys, wrong types and impossible values are refused with a
RubricError that names the file and the key and, for unknown keys, lists the valid ones.

The public rubric, what students' `check` and `package` grade with, is derived from it
(`public_rubric`): its public checks and nothing hidden. Grading and students' check run the same
public checks: each public check of the file at its own world size and then at each of
`public_world_sizes` (at_public_world_sizes, when the file is read). The student release holds the
public rubric written out as `grader/rubric-public.yaml`, in place of rubric.yaml.
"""

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from grader import feasible, kit, typed
from grader.limits import (CODE_KB, CODE_LINES, HANDIN_SECONDS, PART_SECONDS, PROCESS_GROUP_SECONDS,
                           WORLD_START_SECONDS, Limits)
from grader.lmss import id_regex
from grader.parts import BY_ID, CORE_PART_IDS, KIND_BY_NAME, KINDS, OWN_SIZES, PART_IDS, PARTS
from grader.worth import HiddenGroup, hidden_summary

DEFAULT_RUBRIC = kit.RUBRIC
PUBLIC_RUBRIC = kit.PUBLIC_RUBRIC


class RubricError(ValueError):
    """The rubric file is not valid; the message names the file, the key and what to do."""


@dataclass
class PartPoints:
    log: float = 0.0     # for the hand-in's .log showing the part matching on every rank
    rerun: float = 0.0   # for the grader's own re-run matching the reference at every check
    bonus: bool = False  # points on top of max_score: a hand-in without the part can still earn it all


@dataclass
class Check:
    """One configuration every part is re-run at, in a world of `world_size` ranks."""
    name: str = "default"
    world_size: int = 4
    seed: int = 42
    global_batch_size: int = 128
    input_dim: int = 64
    output_dim: int = 32
    accumulation_steps: int = 4
    hidden_dim: int = 128  # Part 5 only: the MLP's hidden width (W1 [input_dim, hidden_dim])
    vocab_size: int = 64   # Part 6 only: the vocabulary V (the embedding [V, input_dim], the logits [B, V])
    vocab_logit_shift: float = 0.0   # Part 6 only: added to every logit (1e4: exp overflows without the max)
    vocab_one_slice: bool = False    # Part 6 only: every target in the last rank's slice of the vocabulary
    vocab_padding: int = 0           # Part 6 only: the last this many targets are padding (ignore_index)
    num_heads: int = 4     # the transformer block only: its attention heads (split over the ranks)
    head_dim: int = 8      # ... the features of one head: the block's width d = num_heads * head_dim
    seq_len: int = 8       # ... the tokens of one sequence: its input X [global_batch_size, seq_len, d]
    num_layers: int = 2    # ... its step: the blocks of the tiny transformer (embedding, blocks, loss)
    hidden: bool = False   # named in feedback, its values never shown
    weight: float = 1.0    # share of each part's re-run points (of the parts it runs)
    nodes: int = 1         # the world laid out as this many nodes of world_size / nodes ranks each
                           # (LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, SLURM_NODEID as on a cluster)
    kind: str = "step"     # step: every part takes its SGD step; backward: Part 4's layer (Part 5's block)
                           # alone, forward and backward, against the single-device layer's (block's)

    def parts(self) -> tuple:
        """The parts of every course this check runs (Rubric.parts_at adds the optional ones)."""
        return tuple(p for p in CORE_PART_IDS if self.kind in BY_ID[p].kinds)

    def label(self) -> str:
        if self.hidden:
            return f"hidden check '{self.name}'"
        layout = f", {self.nodes} nodes" if self.nodes > 1 else ""
        what = KIND_BY_NAME[self.kind].label if self.kind in KIND_BY_NAME else ""
        return (f"check '{self.name}' (world size {self.world_size}{layout}, seed {self.seed}, batch "
                f"{self.global_batch_size}, W {self.input_dim}x{self.output_dim}, "
                f"{self.accumulation_steps} micro-batches{what})")


@dataclass
class Tolerance:
    """The re-run's tolerance. The log's check (utils.compare_tensors, rtol = atol = 1e-5) compares a
    run with the closed form computed in the same run; a re-run is compared with the grader's closed
    form from another process, at world sizes whose all-reduce sums in other orders, so rtol is
    looser. utils.py is not changed to say so: hand-ins are compared with it byte for byte."""
    rtol: float = 1e-4   # torch.allclose's rtol between a re-run weight and the reference
    atol: float = 1e-5   # and its atol


@dataclass
class Timeouts:
    """In seconds; each default, and what it means, is grader/limits.py's."""
    part: float = PART_SECONDS
    process_group: float = PROCESS_GROUP_SECONDS
    world_start: float = WORLD_START_SECONDS
    handin: float = HANDIN_SECONDS


@dataclass
class Files:
    penalty_missing_utils: float = 0.0   # points off when utils.py is not in the hand-in
    penalty_missing_log: float = 0.0     # points off when the .log is missing (its log points are lost anyway)
    penalty_missing_err: float = 2.0     # points off when the .err is missing
    penalty_modified_utils: float = 0.0  # points off when utils.py differs from the provided one
    student_id_pattern: str = r"(?P<id>.+)"  # regex on the hand-in's name without extension, or an LMS's (grader.lmss)
    invalid_scores_zero: bool = False    # an invalid hand-in (unreadable zip, no code) scores 0, not no score
    max_member_mb: float = 20.0          # largest single file in a zip
    max_total_mb: float = 100.0          # largest total unpacked size
    max_members: int = 500               # most files in a zip
    max_code_kb: float = CODE_KB         # largest assignment4.py (grader.limits: what parsing costs)
    max_code_lines: int = CODE_LINES     # most lines of it


@dataclass
class Gradescope:
    max_submissions: int = 0     # graded submissions per student (0: no limit); later ones keep the last result
    window_hours: float = 0.0    # counted over this many hours before the submission's created_at (0: all)


@dataclass
class Rubric:
    parts: dict = field(default_factory=lambda: {p: PartPoints() for p in CORE_PART_IDS})
    checks: list = field(default_factory=lambda: [Check()])
    tolerance: Tolerance = field(default_factory=Tolerance)
    learning_rate: float = 0.5   # the handout fixes it at 0.5; checks do not vary it
    log_min_world_size: int = 4  # the fewest ranks the run in the .log may have (4 nodes; more with GPUs)
    log_min_nodes: int = 1       # the fewest nodes (distinct hosts) the run in the .log may have
    log_slurm_job: bool = False  # the .log must come from a Slurm job: not slurm/run-local.sh's
                                 # "[Job] id=local-...", not torchrun's output redirected by hand
    timeouts: Timeouts = field(default_factory=Timeouts)
    limits: Limits = field(default_factory=Limits)
    files: Files = field(default_factory=Files)
    gradescope: Gradescope = field(default_factory=Gradescope)
    public_world_sizes: list = field(default_factory=lambda: [4, 1, 2])  # grading and the students'
                                 # check run each public check at its own world size, then at these
                                 # (one node), its weight shared by them (at_public_world_sizes)
    one_rank_needs_parallel: bool = True  # a parallel part's one-rank checks earn points only once it
                                 # passed a check of the same kind on more ranks (grader.worth)
    score_decimals: int = 2      # every score is rounded to this many decimals, once (grader.worth)
    hidden_summary: list[HiddenGroup] = field(default_factory=list)  # the public rubric's account of
                                 # the hidden checks it leaves out (grader.worth.hidden_summary)

    @property
    def default_check(self) -> Check:
        """The first public step check: the configuration the handout states and the reference
        sets, the one a hand-in's .log is held against."""
        return next(c for c in self.checks if not c.hidden and c.kind == "step")

    @property
    def part_ids(self) -> tuple:
        """The parts this rubric grades: every course's, and the optional ones it names (null: off)."""
        return tuple(p for p in PART_IDS if p in self.parts)

    def parts_at(self, check: Check) -> tuple:
        """The parts of this rubric that `check` runs."""
        return tuple(p.id for p in PARTS if p.id in self.parts and check.kind in p.kinds)

    @property
    def max_score(self) -> float:
        return sum(p.log + p.rerun for p in self.parts.values() if not p.bonus)   # a bonus comes on top

    def digest(self) -> str:
        """sha256 of the rubric's content (a cache key); a course without Part 5 keeps its old digest."""
        data = dataclasses.asdict(self)
        data["parts"] = {k: {n: v for n, v in p.items() if n != "bonus" or v} for k, p in data["parts"].items()}
        read = {s for p in self.parts for s in BY_ID[p].own_sizes}   # a size only a part that is off reads: none
        data["checks"] = [{n: v for n, v in c.items() if n not in OWN_SIZES or n in read} for c in data["checks"]]
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


def _build(cls, data, where: str):
    """Dataclass `cls` from the mapping `data` (grader.typed): unknown keys and wrong types refused."""
    return typed.build(cls, data, where, RubricError)


def rubric_from_dict(data: dict, source: str = "rubric") -> Rubric:
    data = dict(data or {})
    parts_data = data.pop("parts", None)
    checks_data = data.pop("checks", None)
    rubric = _build(Rubric, data, source)
    if parts_data is not None:
        if not isinstance(parts_data, dict):
            raise RubricError(f"{source}.parts: expected a mapping of part ids to points")
        unknown = sorted(set(parts_data) - set(PART_IDS))
        if unknown:
            raise RubricError(f"{source}.parts: unknown part '{unknown[0]}'; valid parts: {', '.join(PART_IDS)}")
        rubric.parts = {p: _build(PartPoints, parts_data.get(p) or {}, f"{source}.parts.{p}") for p in PART_IDS
                        if not BY_ID[p].optional or parts_data.get(p) is not None}
    if checks_data is not None:
        if not isinstance(checks_data, list) or not checks_data:
            raise RubricError(f"{source}.checks: expected a non-empty list of checks")
        rubric.checks = _built_checks(checks_data, source)
    said = _validate(rubric, source)
    derived = {}
    if not feasible.sizes_problem(rubric, source):
        derived = {c.name: o.name for o in rubric.checks if not o.hidden
                   for c in at_public_world_sizes([o], rubric.public_world_sizes)[1:]}
        rubric.checks = at_public_world_sizes(rubric.checks, rubric.public_world_sizes)
        said += feasible.name_problems(rubric.checks, derived, source)
    said += feasible.problems(rubric, source, derived)   # what the kit cannot run
    if said:
        raise RubricError(feasible.refusal(source, said))
    return rubric


def _built_checks(checks_data: list, source: str) -> list:
    """The checks, each built by grader.typed; every check's unknown key or wrong type at once."""
    checks, said = [], []
    for i, data in enumerate(checks_data):
        try:
            checks.append(_build(Check, data, f"{source}.checks[{i}]"))
        except RubricError as e:
            said.append(str(e))
    if said:
        raise RubricError(feasible.refusal(source, said))
    return checks


def at_public_world_sizes(checks: list, sizes: list) -> list:
    """The checks grading runs: each public check at its own world size and then at each of
    `sizes` (on one node, named e.g. 'default-2-ranks'), its weight shared equally by them, so the
    public configuration weighs what it weighs at one world size and the hidden checks keep their
    shares; the hidden checks as they are. Students' check runs the same public checks."""
    out = []
    for check in checks:
        if check.hidden:
            out.append(check)
            continue
        at = [check.world_size] + [n for n in dict.fromkeys(sizes) if n != check.world_size]
        share = check.weight / len(at)
        out.append(dataclasses.replace(check, weight=share))
        for size in at[1:]:
            name = f"{check.name}-{size}-rank{'s' if size > 1 else ''}"
            out.append(dataclasses.replace(check, name=name, world_size=size, nodes=1, weight=share))
    return out


def _validate(rubric: Rubric, source: str) -> list:
    """Every value no check or rubric can have, one line each ([] when none)."""
    return [*feasible.value_problems(rubric.checks, source, KINDS), *filter(None, [feasible.sizes_problem(rubric, source)]),
            *feasible.rubric_problems(rubric, source), *_pattern_problems(rubric, source)]


def _pattern_problems(rubric: Rubric, source: str) -> list:
    try:
        pattern = re.compile(id_regex(rubric.files.student_id_pattern))
    except re.error as e:
        return [f"{source}.files.student_id_pattern: not a valid regular expression ({e})"]
    if "id" not in pattern.groupindex:
        return [f"{source}.files.student_id_pattern: needs a named group (?P<id>...)"]
    return []


def _read(path: Path) -> dict:
    data = kit.read_yaml(path, "rubric", RubricError)
    if data is not None and not isinstance(data, dict):
        raise RubricError(f"{path}: a rubric is a mapping of keys (parts, checks, tolerance, ...)")
    return data or {}


def _merge(base: dict, changes: dict) -> dict:
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def load_rubric(path=None) -> Rubric:
    """The course's rubric (grader/rubric.yaml), with the changes in `path` read on top of it."""
    # The student release ships only the public rubric, complete in itself, in its place.
    base = DEFAULT_RUBRIC if DEFAULT_RUBRIC.exists() else PUBLIC_RUBRIC
    data = _read(base) if base.exists() else {}
    path = Path(path) if path else base
    if path.resolve() != base.resolve():
        data = _merge(data, _read(path))
    return rubric_from_dict(data, str(path))


def public_rubric(rubric: Rubric) -> Rubric:
    """What students' check and package grade with: `rubric` without its hidden checks and without
    the graders' Gradescope limits. Its public checks are those grading runs: already at every public
    world size (at_public_world_sizes, when the rubric was read), so its public_world_sizes is empty."""
    checks = [c for c in rubric.checks if not c.hidden]
    summary = hidden_summary(rubric) if len(checks) < len(rubric.checks) else rubric.hidden_summary
    return dataclasses.replace(rubric, checks=checks, gradescope=Gradescope(), public_world_sizes=[],
                               hidden_summary=summary)


def load_public_rubric(path=None) -> Rubric:
    """The public rubric: derived from grader/rubric.yaml (and `path` on top) where it exists, the
    instructors' tree; read from grader/rubric-public.yaml (and `path` on top) in the release."""
    return public_rubric(load_rubric(path))

