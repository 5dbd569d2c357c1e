"""The staff report (report.html, analytics.json) on results written as grading writes them: a
check nobody passes is flagged with the reference's result beside it, the final gradebook adds the
final grades and late days, and the page renders in a real browser (headless Chromium, where one is
installed). The report of a whole graded corpus is checked against grades.csv in test_grader.py."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from grader.analytics.numbers import REFERENCE_PASSED, analyse
from grader.analytics.page import LOOK, MATRICES_FROM, STAFF_ONLY, refresh_integrity, write_report
from grader.grades.commands import make_gradebook
from grader.parts import BY_ID, PART_IDS
from grader.results import CheckOutcome, Status
from tests.conftest import skip_unless_required
from tests.test_gradebook import RUBRIC, out_with, policy_file, result

STRICT = "too-strict"   # a hidden check of the rubric below that nobody passes


def batch(tmp_path, n: int = 5):
    """`n` results: all right at the rubric's checks but the first loses data_parallel points, and
    every one wrong at STRICT, a further hidden check of Part 3."""
    results = [result(f"s{i}", lost={"data_parallel": 7} if i == 0 else None) for i in range(n)]
    for r in results:
        r.parts["data_parallel"].checks.append(CheckOutcome(check=STRICT, hidden=True, world_size=3,
                                                            status=Status.FAILED, message="differs"))
    return out_with(tmp_path, *results)


def test_a_check_nobody_passes_gets_the_warning_with_the_references_result(tmp_path):
    out = batch(tmp_path)
    a = write_report(out)
    assert a.look_at == [{"check": STRICT, "part": "data_parallel", "reference": REFERENCE_PASSED,
                          "why": "nobody passes it: 0 of 5 hand-ins"}]
    assert a.pass_rates[STRICT] == {"data_parallel": {"passed": 0, "ran": 5}}
    page = (out / "report.html").read_text()
    assert LOOK[0].upper() + LOOK[1:] in page and f"<code>{STRICT}</code>" in page and REFERENCE_PASSED in page
    assert page.index(STAFF_ONLY.split(".")[0]) < page.index("<h1>")   # said first
    assert json.loads((out / "analytics.json").read_text())["look_at"] == a.look_at


def test_without_that_check_nothing_is_flagged(tmp_path):
    out = out_with(tmp_path, *[result(f"s{i}", lost={"data_parallel": 7} if i < 2 else None) for i in range(4)])
    a = analyse(out)
    assert a.look_at == [] and a.pass_rates[RUBRIC.checks[0].name]["data_parallel"] == {"passed": 2, "ran": 4}
    assert a.scores == sorted(r for r in a.scores) and len(a.scores) == 4


def test_a_check_wrong_only_where_another_part_is_wrong_is_flagged(tmp_path):
    # Part 4 is wrong in exactly the hand-ins wrong at Part 3, which are right at Parts 1 and 2.
    both = [result(f"w{i}", lost={"data_parallel": 7, "tensor_parallel": 5}) for i in range(3)]
    out = out_with(tmp_path, *both, result("dp_only", lost={"data_parallel": 7}), result("ok"))
    flagged = {(x["check"], x["part"]) for x in analyse(out).look_at}
    assert {(c.name, "tensor_parallel") for c in RUBRIC.checks} <= flagged
    assert not {p for _, p in flagged} - {"tensor_parallel"}   # Part 3 is wrong alone in dp_only


def test_the_gradebook_writes_it_again_with_final_grades_and_late_days(tmp_path):
    out = batch(tmp_path, 3)
    write_report(out)
    assert json.loads((out / "analytics.json").read_text())["final"] is None
    policy = policy_file(tmp_path, submissions=[["s0", "2026-04-14T23:00:00+02:00", ""],
                                                ["s1", "2026-04-16T12:00:00+02:00", ""]])
    make_gradebook(out, policy)
    numbers = json.loads((out / "analytics.json").read_text())
    assert len(numbers["final"]) == 3 and numbers["late_days"] and "0" in numbers["late_days"]
    page = (out / "report.html").read_text()
    assert "with the final grades" in page and "final: median" in page and "days late" in page


def test_it_renders_in_headless_chromium(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        skip_unless_required("A4_REQUIRE_CHROMIUM", "no headless Chromium here (Debian: apt-get install chromium); .ci/run installs it")
    out = batch(tmp_path, MATRICES_FROM)   # a class the plots are drawn for
    write_report(out)
    png = tmp_path / "report.png"
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}",
                           "--window-size=1280,5000", (out / "report.html").as_uri()],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, HOME=str(tmp_path)))
    assert proc.returncode == 0 and png.is_file(), proc.stderr[-2000:]
    from PIL import Image
    image = Image.open(png).convert("RGB")
    assert image.size == (1280, 5000)
    r, g, b = image.getpixel((640, 10))
    assert r > 90 and g < 40 and b < 40, (r, g, b)   # the staff-only banner, first
    # The plots drew: many coloured (not grey) pixels below the banner.
    body = image.crop((0, 200, 1280, 5000)).resize((320, 1200))
    coloured = sum(1 for p in body.getdata() if max(p) - min(p) > 60)
    assert coloured > 2000, coloured
    if os.environ.get("A4_REPORT_PNG"):   # to look at it
        shutil.copy(png, os.environ["A4_REPORT_PNG"])


def test_the_command_line_stays_free_of_matplotlib():
    code = ("import sys\nfrom grader import cli, plots\nfrom grader.analytics import page\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('matplotlib' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines()[-1] == "False", proc.stdout[-500:] + proc.stderr


def test_every_graded_part_has_a_column_and_a_part_turned_off_has_none(tmp_path):
    a = analyse(batch(tmp_path, 2))
    graded = [p for p in PART_IDS if p in RUBRIC.parts]
    assert a.parts == graded and list(a.by_visibility) == graded and a.cofailure["parts"] == graded
    off = [BY_ID[p].title for p in PART_IDS if p not in RUBRIC.parts]
    page = (write_report(tmp_path / "out") and (tmp_path / "out" / "report.html").read_text())
    assert all(title not in page for title in off) and all(BY_ID[p].title in page for p in graded)


def test_the_integrity_command_gives_the_report_its_count_and_keeps_the_final_grades(tmp_path):
    out = batch(tmp_path, 3)
    make_gradebook(out, policy_file(tmp_path))
    (out / "integrity.csv").write_text("student_a,student_b,strength,evidence\ns0,s1,strong,same run\n")
    (out / "integrity.md").write_text("# Integrity report\n")
    assert refresh_integrity(out)
    numbers = json.loads((out / "analytics.json").read_text())
    assert numbers["integrity"] == {"pairs": 1, "strong": 1, "report": "integrity.md"}
    assert len(numbers["final"]) == 3
    assert '<a href="integrity.md">' in (out / "report.html").read_text()
