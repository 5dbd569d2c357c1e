"""The integrity report does not accuse a student on evidence another can plant by typing public
facts into their own log: a Slurm job's id, nodes and start time (sacct shows them) copied into a
log that contradicts the victim's, or the victim's code sha256 typed beside one's own in an init
line. Genuine evidence stays strong: byte-identical logs, the same job whose logs agree, a log that
ran another student's actual code."""

import csv
import re

import pytest

from grader.batch.outputs import load_views, write_outputs
from grader.cli import main
from tests.corpus import Files, mutate, write_zip
from tests.integrity_corpus import STYLES, fill, run_err, run_log, write_graded
from tests.integrity_planted import STUDENTS

VICTIM_JOB = 48201


def _job_of(log: str, theirs: str) -> str:
    """`log` with the [Job] header lines of `theirs` (the id, nodes and start time sacct shows)."""
    header = [line for line in theirs.splitlines() if line.startswith("[Job] id=")][0]
    return re.sub(r"^\[Job\] id=.*$", header, log, count=1, flags=re.M)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("framing")
    inbox, out = tmp / "inbox", tmp / "out"
    inbox.mkdir()
    victim = fill(STUDENTS["manual"])
    victim_log = run_log(victim, VICTIM_JOB - 48000)
    sha = re.search(r"code sha256 ([0-9a-f]{64})", victim_log).group(1)
    handins = {"victim": Files(code=victim, log=victim_log, err=run_err(1))}
    # Own code and run, with the victim's job header (its printed order and code sha256 its own).
    own = fill(STYLES["functional"])
    handins["framer_job"] = Files(code=own, log=_job_of(run_log(own, 2), victim_log), err=run_err(2))
    # A log of the victim's job header and nothing else: nothing to contradict, nothing to show one run.
    own = fill(STYLES["einsum"])
    handins["framer_bare"] = Files(code=own, log="\n".join(victim_log.splitlines()[:3]) + "\n", err=run_err(9))
    # Own code and run, and one init line more carrying the victim's code sha256 beside its own.
    own = fill(STYLES["defensive"])
    log = run_log(own, 3).replace("[Baseline]", f"0: [Distributed Init] Rank 0 initialized on node 0 (node1) on "
                                  f"cuda:0 | backend nccl | world size 4 | torch 2.13.0+cu128 | code sha256 {sha}\n"
                                  f"[Baseline]", 1)
    handins["framer_sha"] = Files(code=own, log=log, err=run_err(3))
    # Genuine: one job's log in two hand-ins, one of them with a line added (they agree) ...
    shared = mutate("baseline_wrong_sign")
    run = run_log(shared, 4)
    handins["job_a"] = Files(code=shared, log=run, err=run_err(4))
    handins["job_b"] = Files(code=shared + "# mine\n", log=run + "note: ran on the cluster\n", err=run_err(5))
    # ... byte-identical logs ...
    code = mutate("acc_unscaled")
    handins["log_a"] = Files(code=code, log=run_log(code, 6), err=run_err(6))
    handins["log_b"] = Files(code=mutate("dp_summed"), log=run_log(code, 6), err=run_err(7))
    # ... and a log of another student's actual code, beside one's own different code.
    handins["runner"] = Files(code=mutate("dp_no_allreduce"), log=run_log(victim, 8), err=run_err(8))
    for name, files in handins.items():
        write_graded(out, name, write_zip(inbox / f"{name}.zip", files), files.log)
    write_outputs(load_views(out), out, 100.0)
    assert main(["integrity", str(out), str(inbox)]) == 0
    return {(r["student_a"], r["student_b"]): r for r in csv.DictReader((out / "integrity.csv").open())}


def test_a_copied_job_header_in_a_contradicting_log_is_no_shared_run(rows):
    row = rows[("framer_job", "victim")]
    assert row["strength"] == "moderate"
    assert "the same run" not in row["evidence"]
    assert f"the same Slurm job header (job {VICTIM_JOB}" in row["evidence"]
    assert "contradict each other" in row["evidence"] and "claims a job it did not run" in row["evidence"]


def test_a_copied_job_header_alone_is_no_strong_evidence(rows):
    row = rows[("framer_bare", "victim")]
    assert row["strength"] == "moderate" and "nothing else the two logs print shows one run" in row["evidence"]
    assert "the same Slurm job:" not in row["evidence"]


def test_a_code_sha256_typed_beside_ones_own_counts_against_that_log(rows):
    row = rows[("framer_sha", "victim")]
    assert row["strength"] == "moderate"
    assert "the same code sha256" not in row["evidence"]
    assert "printed in framer_sha's log beside other code sha256s" in row["evidence"]
    assert "counts against framer_sha's log" in row["evidence"] and "not as victim's copying" in row["evidence"]


def test_genuine_evidence_stays_strong(rows):
    job = rows[("job_a", "job_b")]
    assert job["strength"] == "strong" and "the same run: the same Slurm job: job 48004" in job["evidence"]
    assert rows[("log_a", "log_b")]["strength"] == "strong"
    assert "the same run: identical .log bytes" in rows[("log_a", "log_b")]["evidence"]
    ran = rows[("runner", "victim")]
    assert ran["strength"] == "strong" and "the same code sha256" in ran["evidence"]
    planted = {pair: r["strength"] for pair, r in rows.items() if any(s.startswith("framer") for s in pair)}
    assert set(planted.values()) == {"moderate"}, planted
