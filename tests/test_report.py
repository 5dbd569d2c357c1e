"""The staff report (report.html, analytics.json) on results written as grading writes them: a
check nobody passes is flagged with the reference's result beside it, the final gradebook adds the
final grades and late days, and the page renders in a real browser (headless Chromium, where one is
installed). The report of a whole graded corpus is checked against grades.csv in test_grader.py."""

import contextlib
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import zipfile
from pathlib import Path

import pytest

from grader.analytics.numbers import REFERENCE_PASSED, analyse
from grader.analytics.page import LOOK, MATRICES_FROM, STAFF_ONLY, refresh_integrity, write_report
from grader.grades.commands import make_gradebook
from grader.parts import BY_ID, PART_IDS
from grader.results import CheckOutcome, Status
from tests.conftest import skip_unless_required
from tests.test_gradebook import RUBRIC, out_with, policy_file, result

pytestmark = pytest.mark.lms   # make test-lms runs these; make test leaves them out

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
    # Each row shows what the gradebook made of its hand-in: the final grade, the penalty, the overrides.
    rows = {row["key"]: row["final"] for row in numbers["students"]}
    assert rows["s1"] == {"grade": "80", "penalty": "20", "late_days": 2, "overrides": ""}, rows["s1"]
    assert rows["s0"]["grade"] == "93" and rows["s0"]["penalty"] == "", rows["s0"]
    triage = html.unescape(page[page.index('id="students"'):page.index("</table>", page.index('id="students"'))])
    assert "<th>final grade</th>" in triage and "late 2 day(s): \u221220" in triage


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
    coloured = sum(1 for p in body.get_flattened_data() if max(p) - min(p) > 60)
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


# --- every LMS's download, graded for real: the rows a TA acts on, every link followed in Chromium ---

# One download per LMS, each with the same six kinds of hand-in: right, a missing all-reduce, wrong
# loss scaling, a hang, a crash, and a right one handed in late. kind -> (the corpus mutant, or ""
# for the reference; the part it loses and words its reason must hold).
KINDS = {"right": ("", "", ""), "noreduce": ("dp_no_allreduce", "data_parallel", "stepped on its own slice"),
         "unscaled": ("acc_unscaled", "grad_accumulation", "not divided by accumulation_steps"),
         "hang": ("deadlock_skipped_collective", "data_parallel", "waited in collective #1 of the part (all_reduce of"),
         "crash": ("crash_on_one_rank", "data_parallel", "crashed at check 'default': RuntimeError"),
         "late": ("", "", "")}
LATE_TIME = "2026-04-16-08-00-00"   # Blackboard's attempt time of the late one, past test_gradebook's DEADLINE


def _handins(reference_run) -> dict:
    """kind -> the hand-in zip's bytes, each with the reference's real .log made to claim its code."""
    from tests.corpus import REFERENCE, Files, mutate, refingerprint, zip_bytes
    log, err = reference_run
    zips = {}
    for kind, (mutant, _, _) in KINDS.items():
        code = mutate(mutant) if mutant else REFERENCE.read_text() + ("# handed in late\n" if kind == "late" else "")
        zips[kind] = zip_bytes(Files(code=code, log=refingerprint(log, code), err=err))
    return zips


def _download(lms: str, zips: dict) -> tuple:
    """The members of `lms`'s download, and kind -> the student id grading gives that hand-in."""
    if lms == "canvas":   # login_[LATE_]userid_submissionid_file; the right one as loose files
        ids = {kind: f"10{i}" for i, kind in enumerate(KINDS)}
        members = {f"{k}_{'LATE_' if k == 'late' else ''}{ids[k]}_90{i}_a4.zip": zips[k]
                   for i, k in enumerate(KINDS) if k != "right"}
        with zipfile.ZipFile(io.BytesIO(zips["right"])) as z:
            members |= {f"right_{ids['right']}_900_{n}": z.read(n) for n in z.namelist()}
    elif lms == "moodle":
        ids = {kind: f"20{i}" for i, kind in enumerate(KINDS)}
        members = {f"Student {k.title()}_{ids[k]}_assignsubmission_file_/handin.zip": zips[k] for k in KINDS}
    elif lms == "blackboard":
        ids = {kind: f"bb{kind}" for kind in KINDS}
        members = {}
        for k in KINDS:
            at = LATE_TIME if k == "late" else "2026-04-14-20-00-00"
            members[f"Assignment 4_{ids[k]}_attempt_{at}_handin.zip"] = zips[k]
            members[f"Assignment 4_{ids[k]}_attempt_{at}.txt"] = f"Name: Student {k} ({ids[k]})\n"
    else:
        ids = {kind: f"s24000{i}" for i, kind in enumerate(KINDS)}
        meta = "".join(f"submission_{i}:\n  :submitters:\n  - :name: Student {k}\n    :sid: '{ids[k]}'\n"
                       f"  :created_at: 2026-04-{16 if k == 'late' else 14} 09:00:00.000000000 +02:00\n"
                       for i, k in enumerate(KINDS))
        members = {"assignment_4242_export/submission_metadata.yml": meta}
        members |= {f"assignment_4242_export/submission_{i}/handin.zip": zips[k] for i, k in enumerate(KINDS)}
    return members, ids


LMSES = ("canvas", "moodle", "blackboard", "gradescope")
UNZIPPED = ("moodle", "gradescope")   # the others are graded as the zip the LMS gives


@pytest.fixture(scope="module")
def lms_batches(tmp_path_factory, reference_run):
    """lms -> (OUT, kind -> student id, [(grade's exit, stdout, stderr)]). Each download is graded
    once; Canvas's a second time into the same OUT, where every result is reused."""
    from grader.cli import main
    from tests.corpus import fast_rubric
    from tests.test_download import as_folder, make_zip
    tmp = tmp_path_factory.mktemp("lms")
    rubric = fast_rubric(tmp, checks=[{"name": "default"}], public_world_sizes=[4])
    zips, batches = _handins(reference_run), {}
    for lms in LMSES:
        members, ids = _download(lms, zips)
        path = tmp / f"{lms}-download.zip"
        if lms in UNZIPPED:
            path = as_folder(tmp / f"{lms}-download", members)
        else:
            path.write_bytes(make_zip(members))
        out, runs = tmp / f"{lms}-out", []
        for _ in range(2 if lms == "canvas" else 1):
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = main(["grade", str(path), "--out", str(out), "--rubric", str(rubric), "--quiet", "--jobs", "2"])
            runs.append((code, stdout.getvalue(), stderr.getvalue()))
        batches[lms] = (out, ids, runs)
    return batches


CRAWLER = """<!DOCTYPE html><html><body><pre id="out"></pre><script>
function get(url) { const x = new XMLHttpRequest(); x.open("GET", url, false); x.send(); return x.responseText; }
const seen = {}, todo = [[new URLSearchParams(location.search).get("start"), ""]];
while (todo.length) {
  const [url, from] = todo.shift();
  const key = url.split("#")[0];
  if (key in seen) continue;
  let text = null;
  try { text = get(key); } catch (e) { seen[key] = {ok: false, from: from, error: String(e)}; continue; }
  const doc = new DOMParser().parseFromString(text, "text/html");
  seen[key] = {ok: true, from: from, title: doc.title, links: doc.querySelectorAll("a[href]").length};
  if (key.endsWith(".html")) for (const a of doc.querySelectorAll("a[href]")) todo.push([new URL(a.getAttribute("href"), key).href, key]);
}
document.getElementById("out").textContent = JSON.stringify(seen);
</script></body></html>
"""


def follow_every_link(page, tmp) -> dict:
    """Every page and file reachable from `page` by its links (and theirs), as headless Chromium's
    parser finds the links and its loader follows them: url -> {ok, from, title, links}."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        skip_unless_required("A4_REQUIRE_CHROMIUM", "no headless Chromium here (Debian: apt-get install chromium)")
    tmp.mkdir(parents=True, exist_ok=True)
    crawler = tmp / "crawl.html"
    crawler.write_text(CRAWLER)
    url = f"{crawler.as_uri()}?start={urllib.parse.quote(page.as_uri(), safe='')}"
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--allow-file-access-from-files", "--disable-background-networking", "--disable-sync",
                           "--disable-component-update", f"--user-data-dir={tmp / 'profile'}", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, HOME=str(tmp)))
    found = re.search(r'<pre id="out">(.*?)</pre>', proc.stdout, re.S)
    assert proc.returncode == 0 and found, proc.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.torch
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("lms", LMSES)
def test_each_lms_batch_opens_with_a_row_per_student_worst_first_each_part_lost_and_why(lms_batches, lms):
    out, ids, runs = lms_batches[lms]
    assert [code for code, _, _ in runs] == [0] * len(runs), runs
    assert "graded 6 hand-in(s) and reused 0 earlier result(s)" in runs[0][1]
    if lms == "canvas":   # into an OUT that holds them: what this run did, then what OUT holds
        assert "graded 0 hand-in(s) and reused 6 earlier result(s)" in runs[1][1]
        assert f"{out} holds 6 result(s): graded 6" in runs[1][1]
    a = json.loads((out / "analytics.json").read_text())
    rows = {row["key"]: row for row in a["students"]}
    assert sorted(rows) == sorted(ids.values())
    scores = [row["score"] for row in a["students"]]
    assert scores == sorted(scores)   # worst first
    page = (out / "report.html").read_text()
    triage = page[page.index('id="students"'):page.index("</table>", page.index('id="students"'))]
    for kind, (_, part, words) in KINDS.items():
        row = rows[ids[kind]]
        assert f'<a href="students/{ids[kind]}/feedback.html">{ids[kind]}</a>' in triage, kind
        if part:
            lost = {x["part"]: x for x in row["lost"]}
            assert part in lost and words in lost[part]["reason"], (kind, row["lost"])
            assert words in html.unescape(triage), kind
        else:
            assert row["lost"] == [] and row["shown_score"] == row["max_score"], (kind, row)
    assert rows[ids["crash"]]["lost"][0]["reason"].endswith(")") and "assignment4.py line" in page
    assert "never called it" in rows[ids["hang"]]["lost"][0]["reason"]   # the hang: which rank, which collective
    if lms == "canvas":   # only Canvas's download marks a late hand-in itself
        assert "late" in rows[ids["late"]]["flags"]
    assert page.index('id="students"') < page.index('id="diagnoses"') and 'data-plot="scores"' not in page
    off = [BY_ID[p].title for p in PART_IDS if p not in RUBRIC.parts]
    for text in [page, (out / "summary.md").read_text(), *[(out / "students" / s / "feedback.html").read_text()
                                                          for s in ids.values()]]:
        assert not [t for t in off if t in text]


def _screenshot(page: Path, png: Path, tmp: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
                    f"--user-data-dir={tmp / 'shot'}", f"--screenshot={png}", "--window-size=1280,900", page.as_uri()],
                   capture_output=True, timeout=120, env=dict(os.environ, HOME=str(tmp)))


@pytest.mark.torch
@pytest.mark.timeout(1200)
def test_every_link_on_each_report_and_its_feedback_pages_resolves_in_chromium(lms_batches, tmp_path):
    for lms in LMSES:
        out, ids, _ = lms_batches[lms]
        seen = follow_every_link(out / "report.html", tmp_path / lms)
        broken = {url: v for url, v in seen.items() if not v["ok"]}
        assert not broken, broken
        pages = {Path(urllib.parse.urlparse(url).path).relative_to(out).as_posix(): v for url, v in seen.items()}
        for sid in ids.values():   # every student reachable, on a rendered page, not raw Markdown
            assert pages[f"students/{sid}/feedback.html"]["title"] == f"Assignment 4: feedback for {sid}"
        assert {"report.html", "analytics.json", "grades.csv"} <= set(pages)
        assert pages["report.html"]["links"] >= len(ids) + 2
        if lms == "canvas" and os.environ.get("A4_REPORT_PNG"):   # to look at what a TA sees first
            _screenshot(out / "report.html", Path(os.environ["A4_REPORT_PNG"]), tmp_path)


@pytest.mark.torch
@pytest.mark.timeout(600)
def test_a_batch_the_machine_cannot_grade_says_so_first_and_grade_fails(tmp_path, reference_run):
    """A rubric whose memory limit the reference cannot start under: the canary fails, every hand-in
    is infra_error, and the report, summary.md and grade's exit say why and what to do."""
    from grader.cli import main
    from grader.results import CANARY, read_canary
    from tests.corpus import fast_rubric
    from tests.test_download import as_folder
    members, ids = _download("moodle", _handins(reference_run))
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}], public_world_sizes=[4], limits={"memory_mb": 100})
    out, stderr = tmp_path / "out", io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = main(["grade", str(as_folder(tmp_path / "download", members)), "--out", str(out), "--rubric",
                     str(rubric), "--quiet"])
    assert code == 3
    said = [line for line in stderr.getvalue().splitlines() if "Not graded" in line]
    assert len(said) == 1 and "the reference solution fails" in said[0] and "What to do: raise limits.memory_mb" in said[0]
    canary = read_canary(out)   # the rubric's limit, named, not the machine
    assert canary.status == Status.INFRA_ERROR and canary.kind == "limits" and (out / CANARY).is_file()
    assert canary.cause in said[0] and "limits.memory_mb (100 MB, default 4096) is less than it needs" in canary.cause
    page = (out / "report.html").read_text()
    assert page.index('id="ungradable"') < page.index("<h1>")
    assert canary.cause in html.unescape(page)
    assert 'data-plot="scores"' not in page and 'id="scores"' not in page   # no empty histogram
    summary = (out / "summary.md").read_text().splitlines()
    assert summary[2].startswith("> **Not graded: no hand-in has a score, because the reference solution fails")
    assert {row["status"] for row in json.loads((out / "analytics.json").read_text())["students"]} == {"infra_error"}
