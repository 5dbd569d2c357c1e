"""The course's late and override policy, from YAML: what turns autograde results into final grades.

    deadline: 2026-04-14T23:59:00+02:00
    late_penalty_per_day: 10        # percent of the earned score, per started day late
    max_late_days: 5                # later than that: 0
    late_days_budget: 0             # days a student may use without penalty (a roster column
                                    # `late_days_left` gives each student their own)
    submissions: submissions.csv    # student,submitted_at[,source]; or Gradescope's submission_metadata.json
    roster: roster.csv              # column `student`; the other columns are kept
    extensions: {s2412345: 2026-04-18T23:59:00+02:00}
    overrides:                      # applied before the late penalty
      - {student: s2412345, part: data_parallel, points: 35, reason: "regrade: accepted", sha256: ...}
    handins: {s2412345: "b.zip"}    # which hand-in counts, for a student with several that no time orders

Validated as the rubric is (grader.typed): an unknown key is named with the valid ones; every time
must carry a time zone; student ids are text (quote numeric ids: YAML reads 012 as 10). Paths are
relative to the policy file. Nothing here reads results: grader.grades.book applies the policy.
"""

import dataclasses
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path

from grader import kit, typed
from grader.parts import PART_IDS


class PolicyError(ValueError):
    """The policy (or a file it names) is not valid; the message names the file, the key and what to do."""


@dataclass
class Override:
    student: str        # whose hand-in
    part: str           # a part id (grader.parts)
    points: float       # the part's points instead of the autograde's
    reason: str         # why, for the record ("regrade: accepted")
    sha256: str         # of the hand-in the override was made for (grading.json's sha256)


@dataclass
class Policy:
    deadline: datetime
    late_penalty_per_day: float = 0.0   # percent of the earned score, per started day late
    max_late_days: int = None           # later than this many days: 0 (None: no limit)
    late_days_budget: int = 0           # days late without penalty (roster column late_days_left per student)
    submissions: list = field(default_factory=list)   # Paths of submission-time files
    roster: Path = None
    extensions: dict = field(default_factory=dict)    # student -> their deadline
    overrides: list = field(default_factory=list)     # Override
    handins: dict = field(default_factory=dict)       # student -> the source of the hand-in that counts
    path: str = "policy"                              # the file, for messages


KEYS = [f.name for f in dataclasses.fields(Policy) if f.name != "path"]
OVERRIDE_KEYS = [f.name for f in dataclasses.fields(Override)]


def parse_time(value, where: str) -> datetime:
    """An aware datetime from YAML's datetime or an ISO 8601 text; a time with no zone is refused."""
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            raise PolicyError(f"{where}: {text} is a day, not a time; write it as {text}T23:59:00+02:00 "
                              f"(the time and its zone)")
        text = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise PolicyError(f"{where}: {value!r} is not a time; write it as 2026-04-14T23:59:00+02:00") from None
    if isinstance(value, date) and not isinstance(value, datetime):
        raise PolicyError(f"{where}: {value} is a day, not a time; write it as {value}T23:59:00+02:00 "
                          f"(the time and its zone)")
    if not isinstance(value, datetime):
        raise PolicyError(f"{where}: expected a time such as 2026-04-14T23:59:00+02:00, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise PolicyError(f"{where}: {value.isoformat()} has no time zone; write it as "
                          f"{value.isoformat()}+02:00 (your zone), or with Z for UTC")
    return value


def _student(value, where: str) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise PolicyError(f"{where}: the student id {value!r} must be quoted ('{value}'): YAML reads "
                          f"numbers its own way (012 is 10)")
    raise PolicyError(f"{where}: expected a student id, got {value!r}")


def _number(value, where: str, whole: bool = False):
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) or value < 0:
        raise PolicyError(f"{where}: expected a {'whole ' if whole else ''}number, 0 or more, got {value!r}")
    return value if whole else float(value)


def _mapping(value, where: str, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PolicyError(f"{where}: expected a mapping of student ids to {what}")
    return value


def _override(item, where: str) -> Override:
    if not isinstance(item, dict):
        raise PolicyError(f"{where}: expected a mapping of {', '.join(OVERRIDE_KEYS)}")
    typed.refuse_unknown(item, OVERRIDE_KEYS, where, PolicyError)
    missing = [k for k in OVERRIDE_KEYS if k not in item]
    if missing:
        raise PolicyError(f"{where}: '{missing[0]}' is missing; an override needs {', '.join(OVERRIDE_KEYS)} "
                          f"(sha256: the hand-in's, from its grading.json)")
    if item["part"] not in PART_IDS:
        raise PolicyError(f"{where}.part: unknown part {item['part']!r}; valid parts: {', '.join(PART_IDS)}")
    if not isinstance(item["reason"], str) or not item["reason"].strip():
        raise PolicyError(f"{where}.reason: say why, for the record")
    sha = str(item["sha256"]).strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise PolicyError(f"{where}.sha256: expected the 64 hex digits of the hand-in's sha256 (its grading.json)")
    return Override(student=_student(item["student"], f"{where}.student"), part=item["part"],
                    points=_number(item["points"], f"{where}.points"), reason=item["reason"].strip(), sha256=sha)


def policy_from_dict(data: dict, path: str = "policy", base: Path = Path(".")) -> Policy:
    """Validate `data` (the policy file's mapping); relative paths are read from `base`."""
    if not isinstance(data, dict):
        raise PolicyError(f"{path}: a policy is a mapping of keys ({', '.join(KEYS)})")
    typed.refuse_unknown(data, KEYS, path, PolicyError)
    if "deadline" not in data:
        raise PolicyError(f"{path}: 'deadline' is missing (e.g. deadline: 2026-04-14T23:59:00+02:00)")
    policy = Policy(deadline=parse_time(data["deadline"], f"{path}.deadline"), path=path)
    if "late_penalty_per_day" in data:
        policy.late_penalty_per_day = _number(data["late_penalty_per_day"], f"{path}.late_penalty_per_day")
        if policy.late_penalty_per_day > 100:
            raise PolicyError(f"{path}.late_penalty_per_day: a percent of the earned score, at most 100")
    if data.get("max_late_days") is not None:
        policy.max_late_days = _number(data["max_late_days"], f"{path}.max_late_days", whole=True)
    if "late_days_budget" in data:
        policy.late_days_budget = _number(data["late_days_budget"], f"{path}.late_days_budget", whole=True)
    files = data.get("submissions") or []
    for name in [files] if isinstance(files, str) else files if isinstance(files, list) else [files]:
        if not isinstance(name, str):
            raise PolicyError(f"{path}.submissions: expected a file name or a list of them, got {name!r}")
        policy.submissions.append(base / name)
    if data.get("roster") is not None:
        if not isinstance(data["roster"], str):
            raise PolicyError(f"{path}.roster: expected a file name, got {data['roster']!r}")
        policy.roster = base / data["roster"]
    for key, value in _mapping(data.get("extensions"), f"{path}.extensions", "deadlines").items():
        student = _student(key, f"{path}.extensions")
        policy.extensions[student] = parse_time(value, f"{path}.extensions.{student}")
    overrides = data.get("overrides") or []
    if not isinstance(overrides, list):
        raise PolicyError(f"{path}.overrides: expected a list of overrides")
    policy.overrides = [_override(item, f"{path}.overrides[{i}]") for i, item in enumerate(overrides)]
    for key, value in _mapping(data.get("handins"), f"{path}.handins", "hand-in file names").items():
        if not isinstance(value, str):
            raise PolicyError(f"{path}.handins.{key}: expected the hand-in's file name (its source), got {value!r}")
        policy.handins[_student(key, f"{path}.handins")] = value
    return policy


def load_policy(path) -> Policy:
    path = Path(path)
    data = kit.read_yaml(path, "policy", PolicyError)
    return policy_from_dict(data, str(path), path.parent)
