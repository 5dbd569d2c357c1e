"""Write what the integrity check found: OUT/integrity.csv (one row per pair), OUT/integrity.md (the
same, readable, each pair's evidence side by side), and the note summary.md carries when they list
anything. Every file is written atomically.
"""

import csv
import html
import io
from dataclasses import dataclass, field
from pathlib import Path

from grader.integrity.evidence import ALONE, KGRAMS, KINDS, STRONG, TEMPLATE
from grader.kit import atomic_write
from grader.names import result_files
from grader.results import ToDict

CSV_COLUMNS = ["student_a", "student_b", "strength", "evidence"]
BEGIN, END = "<!-- integrity: begin -->", "<!-- integrity: end -->"   # its section of summary.md
VERDICT = ("**This is evidence for a person to weigh, never a verdict.** Each pair below shares something "
           "independent work rarely shares, and each kind has innocent explanations too: students who worked "
           "together as the course allows, a run or a file a TA shared, one student under two ids. Look at "
           "both hand-ins, ask, and decide. Nothing here changes a grade.")
MEANING = {
    "same_run": "identical `.log` or `.err` bytes, the same Slurm job (id, nodes, start time) in "
                "logs that agree (a job header alone is public: moderate), or the same "
                "comparisons printed in the same order by several ranks: one run's output in two hand-ins.",
    "same_wrong_weight": "a failing part returned the same wrong weight at the same check of the grader's "
                         "re-run. Right answers agree by design; a wrong weight the grader cannot name is "
                         "rare (strong). A usual mistake it names is made independently: shared in two parts "
                         "it is moderate, in one part weak, shown only beside other evidence.",
    "same_code": "what the two wrote beyond the skeleton, with the skeleton, the expected answers, comments, "
                 "docstrings, imports and annotations dropped, every name the code defines, every number and "
                 "string normalised, and each block's independent statements (and the module's functions) put in "
                 "one order: renaming, deleting comments, reformatting, reordering independent lines and moving "
                 "code into functions of its own do not hide a copy. Code most of the batch holds beyond the "
                 "skeleton (a handout of its own: give it with --base) is left out, and each shared piece weighs "
                 "by how few hand-ins hold it: fully when two do, nothing when a twentieth of the batch does.",
    "same_sha256": "assignment4.py byte for byte, or the code sha256 the logs' init lines print, in hand-ins "
                   "of two student ids (the untouched skeleton is left out). Strong only when the file has lines "
                   "of its own: the skeleton with the expected answers typed in is what everyone who types them "
                   "writes (weak, shown only beside other evidence).",
    "contradiction": "what a student can type into their own log from public facts, and that the log itself "
                     "contradicts: the same Slurm job header in two logs whose contents disagree (one run cannot "
                     "print both: one log claims a job it did not run), or another hand-in's code sha256 printed "
                     "in a log beside other code sha256s (it counts against the log that holds both). Moderate at "
                     "most, never the same run or the other's copying, and not a second kind of evidence.",
}


@dataclass
class IntegrityReport(ToDict):
    out: str
    handins: int = 0                  # graded hand-ins read from OUT
    found: int = 0                    # of them, found among the PATHs and read
    paths_given: bool = False
    common: int = 0                   # evidence shared by more hand-ins than this is common, not listed
    pairs: list = field(default_factory=list)       # grader.integrity.evidence.Pair, strongest first
    commons: dict = field(default_factory=dict)     # what was taken as common -> how many
    not_found: list = field(default_factory=list)   # "student (source): why" of hand-ins not read
    notes: list = field(default_factory=list)       # problems reading OUT or the PATHs
    wrong_checks: int = 0             # checks failed on a wrong weight ...
    weight_digests: int = 0           # ... and those whose grading.json records the weight's digest
    base: list = field(default_factory=list)        # the files whose code counts as given
    seconds: float = 0.0
    timings: dict = field(default_factory=dict)     # stage -> seconds: read (unpack, fingerprint), pairs, write
    made_at: str = ""

    @property
    def strong(self) -> int:
        return sum(p.strength == STRONG for p in self.pairs)


def integrity_csv(report: IntegrityReport) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for pair in report.pairs:
        writer.writerow({"student_a": pair.student_a, "student_b": pair.student_b, "strength": pair.strength,
                         "evidence": "; ".join(f"{KINDS[e.kind]}: {e.summary}" for e in pair.evidence)})
    return buffer.getvalue()


def _cell(lines: list, code: bool) -> str:
    """Lines for one table cell: escaped, code as <code>, joined by <br>."""
    shown = [html.escape(line, quote=False).replace("|", "&#124;") for line in lines]
    return "<br>".join(f"<code>{s}</code>" if code else s for s in shown) or "-"


def integrity_markdown(report: IntegrityReport) -> str:
    n = len(report.pairs)
    read = (f"{report.found} of them read from the hand-ins given" if report.paths_given else
            "no hand-ins given, so only what grading.json holds was compared: job provenance, the logs' "
            "code sha256 and wrong weights")
    lines = ["# Integrity report: hand-ins a person should compare", "", VERDICT, "",
             f"Made {report.made_at} in {report.seconds:g} s from {report.handins} graded hand-in(s) in "
             f"`{report.out}` ({read}). **{n} pair(s) listed, {report.strong} strong.** Evidence shared by "
             f"more than {report.common} hand-ins is what a class converges on: counted, not listed.", "",
             "## What each kind of evidence means", ""]
    lines += [f"- **{KINDS[kind]}**: {MEANING[kind]}" for kind in KINDS]
    lines += ["", "A pair is strong when one piece of its evidence is, or when it has two kinds of it (weak "
              "evidence, and a log at odds with itself or the other, do not count). The "
              "code's base (what every hand-in may hold): " + ", ".join(f"`{b}`" for b in report.base) + ".", ""]
    if report.wrong_checks and not report.weight_digests:
        lines += [f"*The wrong behaviour was not compared:* {report.wrong_checks} check(s) failed on a wrong "
                  "weight, but grading.json records no `weight_digest` for them (graded by a grader that did "
                  "not record it; grade again to compare them).", ""]
    lines += ["## Pairs", ""]
    if not report.pairs:
        lines += ["None: no two hand-ins share evidence that independent work would not.", ""]
    else:
        lines += ["| # | student_a | student_b | strength | evidence |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {i} | {p.student_a} | {p.student_b} | {p.strength} | "
                  f"{', '.join(dict.fromkeys(KINDS[e.kind] for e in p.evidence))} |"
                  for i, p in enumerate(report.pairs, 1)]
        lines.append("")
    for i, p in enumerate(report.pairs, 1):
        lines += [f"### {i}. {p.student_a} and {p.student_b}: {p.strength}", "",
                  f"| evidence | {p.student_a} | {p.student_b} |", "| --- | --- | --- |"]
        for e in p.evidence:
            summary = html.escape(e.summary, quote=False).replace("|", "&#124;")
            code = e.kind == "same_code"
            lines.append(f"| **{KINDS[e.kind]}** ({e.strength}): {summary} | {_cell(e.a, code)} | {_cell(e.b, code)} |")
        lines.append("")
    if report.commons:
        lines += ["## Taken as common (not listed)", ""]
        lines += [f"- {count} {what}" + ("" if what in (ALONE, TEMPLATE) or what.startswith(KGRAMS) else
                                          f", each shared by more than {report.common} hand-ins")
                  for what, count in sorted(report.commons.items()) if count]
        lines.append("")
    if report.not_found:
        lines += ["## Hand-ins whose files were not read", "",
                  "Their .log, .err and code were not compared; what grading.json holds was.", ""]
        lines += [f"- {line}" for line in report.not_found] + [""]
    if report.notes:
        lines += ["## Notes", ""] + [f"- {note}" for note in report.notes] + [""]
    return "\n".join(lines)


def integrity_note(out) -> str:
    """The lines summary.md carries about the integrity report: a link to integrity.md when it
    lists any pair, '' when it lists none or was never made."""
    out = Path(out)
    path = out / "integrity.csv"
    try:
        rows = list(csv.DictReader(io.StringIO(path.read_text())))
        made = path.stat().st_mtime
    except (OSError, ValueError, csv.Error):
        return ""
    if not rows:
        return ""
    strong = sum(r.get("strength") == STRONG for r in rows)
    note = (f"## Integrity\n\n{len(rows)} pair(s) of hand-ins ({strong} strong) for a person to compare: "
            f"see [integrity.md](integrity.md). Evidence to weigh, never a verdict.\n")
    if any(p.stat().st_mtime > made for p in result_files(out)):
        note += ("\nSome hand-ins were graded after it was made: run `python -m grader integrity` on this "
                 "folder again.\n")
    return note


def link_summary(out) -> bool:
    """Put integrity_note(out) into out/summary.md, in place of the one there (if any); return
    whether summary.md changed. Without a summary.md, nothing is written."""
    path = Path(out) / "summary.md"
    try:
        text = path.read_text()
    except OSError:
        return False
    kept = text
    if BEGIN in text and END in text.split(BEGIN, 1)[1]:
        before, rest = text.split(BEGIN, 1)
        kept = before.rstrip("\n") + "\n" + rest.split(END, 1)[1].lstrip("\n")
    note = integrity_note(out)
    new = kept.rstrip("\n") + "\n" + (f"\n{BEGIN}\n{note.rstrip()}\n{END}\n" if note else "")
    if new != text:
        atomic_write(path, new)
    return new != text


def write_report(report: IntegrityReport, out) -> None:
    """integrity.csv and integrity.md into `out`, then the note in summary.md."""
    out = Path(out)
    atomic_write(out / "integrity.csv", integrity_csv(report))
    atomic_write(out / "integrity.md", integrity_markdown(report))
    link_summary(out)
