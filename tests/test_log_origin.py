"""Whose run a log's lines are, and where it ran: the claims of a run of other code in the same log
earn nothing, and what the code printed never makes a local run a Slurm job on several nodes."""

import hashlib
from types import SimpleNamespace

from grader.evidence import runs
from grader.evidence.logfile import parse_log
from grader.evidence.runs import LogRule, rule_problems
from grader.verdict.score import log_validity
from tests.corpus import REFERENCE, refingerprint
from tests.test_logs import DATA

STRICT = LogRule(min_world_size=4, min_nodes=4, slurm_job=True)
RUBRIC = SimpleNamespace(log_min_world_size=4, log_min_nodes=1, log_slurm_job=False)
FAKE_HOSTS = "[srun] host=node2 [srun] host=node3 [srun] host=node4\n"


def text(name) -> str:
    return (DATA / name).read_text()


def sha(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def own_partial(other: str, mine: str) -> str:
    """The hand-in's own run, stopped after Part 2, cut from `other` (as the red team built it)."""
    lines = other.splitlines(keepends=True)
    cut = max(i for i, line in enumerate(lines) if "[GradAccumulation]" in line) + 1
    kept = "".join(line for line in lines[:cut]
                   if "DataParallel" not in line and "Part 3" not in line and "[Job] finished" not in line)
    return refingerprint(kept, mine).replace("id=48187", "id=48190")


def chosen(tmp_path, log: str, code_sha256: str, rule=None):
    path = tmp_path / "assignment4-48190.log"
    path.write_text(log)
    return runs.choose([path], code_sha256, rule or LogRule()).run.report


def passed(report) -> dict:
    return {p: e.passed for p, e in report.parts.items()}


MINE = REFERENCE.read_text() + "\n# my code\n"
OTHER = text("a4_cluster_4nodes.log")
FIRST_TWO = {"baseline": True, "grad_accumulation": True, "data_parallel": False, "tensor_parallel": False}


def test_a_run_of_other_code_after_the_own_run_earns_nothing(tmp_path):
    report = chosen(tmp_path, own_partial(OTHER, MINE) + OTHER, sha(MINE))
    assert {p: passed(report)[p] for p in FIRST_TWO} == FIRST_TWO
    assert {"mixed_fingerprints", "other_code_lines"} <= set(report.flag_codes())
    said = next(f.message for f in report.flags if f.code == "other_code_lines")
    assert "other code" in said and "DataParallel" in said
    assert "other code" in report.parts["data_parallel"].message
    assert report.job["id"] == "48190"   # the header of the run of this code, not the later one's
    # the control: the own run alone scores the same
    alone = chosen(tmp_path, own_partial(OTHER, MINE), sha(MINE))
    assert {p: passed(alone)[p] for p in FIRST_TWO} == FIRST_TWO


def test_a_later_job_without_init_lines_or_lines_after_done_earn_nothing(tmp_path):
    """Another job's lines with their init lines deleted are no run's: a job's header ends every
    rank's run, and a rank's done ends its own."""
    headless = "".join(line for line in OTHER.splitlines(keepends=True) if "[Distributed Init]" not in line)
    report = chosen(tmp_path, own_partial(OTHER, MINE) + headless, sha(MINE))
    assert {p: passed(report)[p] for p in FIRST_TWO} == FIRST_TWO
    assert "other_code_lines" in report.flag_codes()
    done = own_partial(OTHER, MINE) + "".join(f"[Rank {r}] done\n" for r in range(4))
    after = "".join(line for line in OTHER.splitlines(keepends=True) if "[Distributed Init]" not in line
                    and "[Job]" not in line and "done" not in line)
    report = chosen(tmp_path, done + after, sha(MINE))
    assert {p: passed(report)[p] for p in FIRST_TWO} == FIRST_TWO


def test_a_run_of_other_code_before_the_own_run_earns_nothing(tmp_path):
    report = chosen(tmp_path, OTHER + own_partial(OTHER, MINE), sha(MINE))
    assert {p: passed(report)[p] for p in FIRST_TWO} == FIRST_TWO


def test_interleaved_runs_keep_to_their_rank(tmp_path):
    """Rank by rank, a line belongs to the run its rank's last init line opened."""
    own = own_partial(OTHER, MINE).splitlines(keepends=True)
    other = OTHER.splitlines(keepends=True)
    woven = "".join(a + b for a, b in zip(own, other)) + "".join(other[len(own):])
    report = chosen(tmp_path, woven, sha(MINE))
    assert report.parts["data_parallel"].passed is False
    assert report.parts["tensor_parallel"].passed is False


def test_log_validity_refuses_mixed_claims_not_tied_to_this_code():
    """A report whose parts were not read for this code (no code sha256 given) holds every run's
    claims: with several codes in the log, it is not evidence for this one."""
    report = parse_log(own_partial(OTHER, MINE) + OTHER, 4)
    usable, flags, notes = log_validity(report, sha(MINE), RUBRIC)
    assert usable is False and "log_mixed_fingerprints" in flags


def test_a_rerun_of_the_same_code_scores_as_today(tmp_path):
    mine_log = refingerprint(OTHER, MINE)
    report = chosen(tmp_path, own_partial(OTHER, MINE) + mine_log, sha(MINE))
    assert all(passed(report).values())
    assert "other_code_lines" not in report.flag_codes()
    assert log_validity(report, sha(MINE), RUBRIC)[0] is True
    single = chosen(tmp_path, mine_log, sha(MINE))
    assert all(passed(single).values()) and single.flag_codes() == []
    assert single.nodes == 4 and single.slurm == "Slurm job 48187"


def local_with_fake_hosts() -> str:
    lines = text("a4_reference.log").splitlines(keepends=True)
    return "".join(lines[:3]) + FAKE_HOSTS * 4 + "".join(lines[3:])


def test_a_local_run_that_prints_srun_lines_is_no_slurm_job():
    report = parse_log(local_with_fake_hosts(), 4)
    assert report.job["id"].startswith("local-")
    assert report.slurm == ""
    assert report.nodes != 4
    assert "nodes_mismatch" in report.flag_codes()
    assert {code for code, _ in rule_problems(report, STRICT)} == {"log_nodes", "log_not_slurm"}


def test_printed_hosts_that_disagree_with_the_init_lines_are_no_node_evidence():
    lines = text("a4_torchrun_redirected.txt").splitlines(keepends=True)
    report = parse_log("".join(lines[:5]) + FAKE_HOSTS + "".join(lines[5:]), 4)
    assert report.nodes != 4 and "nodes_mismatch" in report.flag_codes()
    assert "log_nodes" in {code for code, _ in rule_problems(report, STRICT)}


def test_printed_hosts_that_add_nodes_to_the_init_lines_are_no_node_evidence():
    """The init lines' host among the hosts printed is not enough: the counts must agree too."""
    lines = text("a4_torchrun_redirected.txt").splitlines(keepends=True)
    printed = "".join(f"[srun] rank={r} host=node{r + 1}\n" for r in range(4))
    report = parse_log("".join(lines[:5]) + printed + "".join(lines[5:]), 4)
    assert report.nodes != 4 and "nodes_mismatch" in report.flag_codes()


def test_a_header_of_one_node_is_not_overridden():
    lines = text("a4_reference.log").splitlines(keepends=True)
    forged = "".join(lines[:3]) + "SLURM_JOB_ID=48999\n" + "".join(lines[3:])
    report = parse_log(forged, 4)
    assert report.slurm == "" and report.nodes == 1


def test_genuine_cluster_logs_keep_their_nodes():
    for name in ("a4_cluster_4nodes.log", "slurm-48213.out", "output_2_48240.out", "handout_48311.stdout",
                 "handout_cluster_4nodes.log"):
        report = parse_log(text(name), 4)
        assert report.nodes == 4 and report.slurm, name
        assert "nodes_mismatch" not in report.flag_codes(), name
    local = parse_log(text("a4_reference.log"), 4)
    assert local.nodes == 1 and local.slurm == ""
