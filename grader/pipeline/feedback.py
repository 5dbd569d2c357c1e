"""What a student reads of their result, said once as a document (blocks of text) and written two
ways: feedback.md (Markdown, what an LMS takes back) and feedback.html (a page a browser opens,
from the Jinja2 template templates/feedback.html with autoescape: every text is escaped there).

A document is a list of blocks, each `(kind, content)`:

    ("h1" | "h2" | "p", spans)     a heading or a paragraph
    ("list", [spans, ...])         a bulleted list
    ("table", (head, rows))        head: [str]; rows: [[spans, ...], ...]
    ("code", text)                 a preformatted block (a traceback's last lines, a log excerpt)
    ("hr", None)                   the rule before the colophon

and spans are `[(style, text), ...]` with style "" (plain), "b" (strong), "code", "i" (emphasis) or
"name" (a name from a download: made inert in Markdown, grader.names).

The verdict and message come first, then the evidence. `public_only` leaves the hidden checks'
results out (Gradescope shows them after the due date).
"""

import re
from pathlib import Path

from grader.kit import page_template
from grader.names import inert, plain, student_of
from grader.parts import BY_ID

TEMPLATE = Path(__file__).parent / "templates" / "feedback.html"   # its page, escaped by autoescape

MARKDOWN = {"": "{}", "b": "**{}**", "i": "*{}*", "name": "{}"}


def fmt(points) -> str:
    return f"{points:g}" if points is not None else "-"


def check_spans(o, label: str = None) -> list:
    """One check's line: its name, status and message."""
    name = [("", label)] if label else (
        [("", "hidden check "), ("code", o["check"])] if o["hidden"] else
        [("", "check "), ("code", o["check"]), ("", f" (world size {o['world_size']})")])
    flaky = [("", " "), ("i", "(passed when run again: flagged for a person to look at)")] if o.get("flaky") else []
    return [*name, ("", ": "), ("b", str(o["status"])), ("", f", {o['message']}"), *flaky]


def public_view(part: dict) -> tuple:
    """(status, message) of a part at its public checks only."""
    public = [o for o in part["checks"] if not o["hidden"]]
    if len(public) == len(part["checks"]):
        return part["status"], part["message"] if part["status"] != "passed" else "Passed every re-run check."
    failing = [o for o in public if o["status"] != "passed"]
    if failing:
        return failing[0]["status"], f"check '{failing[0]['check']}': {failing[0]['message']}"
    comm = [o for o in public if not o.get("comm_ok", True)]
    if comm:
        return "failed", f"right weights, but {comm[0]['comm_message']}; no re-run points"
    return "passed", "Passed every public check."


def _part(part: dict, public_only: bool, shown_tracebacks: dict) -> list:
    info = BY_ID[part["part"]]
    status, message = public_view(part) if public_only else (part["status"], part["message"])
    if status == "passed" and not public_only:
        message = "Passed every re-run check."
    blocks = [("h2", [("", f"{info.title}: {status} ({fmt(part['score'])} / {fmt(part['max_score'])})")]),
              ("p", [("b", message)])]
    checks = [check_spans(o) for o in part["checks"] if not (public_only and o["hidden"])]
    blocks += [("list", checks)] if checks else []
    shown = next((o for o in part["checks"] if not o["hidden"] and o.get("traceback")), None)
    if shown:
        head = "\n".join(shown["traceback"].strip("\n").rstrip().splitlines()[-12:])
        if head in shown_tracebacks:
            blocks.append(("p", [("", f"Traceback: the same as {shown_tracebacks[head]}'s, above.")]))
        else:
            shown_tracebacks[head] = info.title.split(":")[0]
            blocks += [("p", [("", "Traceback (check "), ("code", shown["check"]), ("", ", last lines):")]),
                       ("code", head)]
    if part.get("log"):
        log = part["log"]
        blocks.append(("p", [("b", "Log:"), ("", f" {log['message']} ({fmt(log['points'])} / {fmt(part['log_max'])} points)")]))
        if log.get("excerpt"):
            blocks.append(("code", "\n".join(log["excerpt"][:8])))
    elif part.get("log_max"):
        blocks.append(("p", [("b", "Log:"), ("", f" no log evidence (0 / {fmt(part['log_max'])} points)")]))
    return blocks


def _summary(result: dict, public_only: bool) -> list:
    """The paragraph under the table: every public check passed, and what the log earned."""
    parts = result["parts"].values()
    hidden = any(o["hidden"] for p in parts for o in p["checks"])
    public_ok = all(o["status"] == "passed" for p in parts for o in p["checks"] if not o["hidden"])
    log_earned = sum(p.get("log_points") or 0 for p in parts)
    log_max = sum(p.get("log_max") or 0 for p in parts)
    blocks = []
    if result["parts"] and public_ok and any(p["checks"] for p in parts):
        spans = [("", "All public re-run checks passed." + (" Hidden checks run your code at other sizes, seeds, "
                                                            "world sizes and layouts; they are listed by name below."
                                                            if hidden and not public_only else ""))]
        if log_earned < log_max:
            spans += [("", " "), ("b", f"The log earned {fmt(log_earned)} of {fmt(log_max)} log points"),
                      ("", ": see each part's log line and the notes below.")]
        blocks.append(("p", spans))
    if public_only and hidden:
        blocks.append(("p", [("", "Hidden checks run your code at other sizes, seeds and world sizes: their results "
                                  "are shown after the due date, as tests of their own.")]))
    return blocks


def feedback_document(result: dict, public_only: bool = False) -> list:
    """The student's feedback as blocks (see the module docstring)."""
    if result["score"] is None:
        head = [("b", "No score yet"), ("", f" ({result['status']}): {result['message']}")]
    else:
        head = [("b", f"Score: {fmt(result['score'])} / {fmt(result['max_score'])}"), ("", f". {result['message']}")]
    rows = []
    for part in result["parts"].values():
        status = public_view(part)[0] if public_only else part["status"]
        rows.append([[("", BY_ID[part["part"]].title)], [("", str(status))],
                     [("", f"{fmt(part['score'])} / {fmt(part['max_score'])}")]])
    if result["penalties"]:
        rows.append([[("", "penalties")], [], [("", f"-{fmt(sum(result['penalties'].values()))}")]])
    blocks = [("h1", [("", "Assignment 4: feedback for "), ("name", student_of(result["student"]))]), ("p", head),
              ("table", (["part", "re-run", "points"], rows)), *_summary(result, public_only)]
    shown_tracebacks = {}
    for part in result["parts"].values():
        blocks += _part(part, public_only, shown_tracebacks)
    if result["notes"]:
        blocks += [("h2", [("", "Notes on the hand-in")]), ("list", [[("", n)] for n in result["notes"]])]
    return blocks + [("hr", None), ("p", [("", "Hand-in "), ("name", result["source"]), ("", ", sha256 "),
                                          ("code", f"{result['sha256'][:16]}..."),
                                          ("", f", graded {result['graded_at']} by grader {result['grader_version']}.")])]


def _md(spans: list) -> str:
    # A message may quote the hand-in's own words (an exception's text): none of its Markdown or HTML
    # reaches an LMS that renders the page (every character that starts markup escaped, every line
    # break a space), and no backtick of its ends a code span early
    return "".join(_code(text) if style == "code" else MARKDOWN[style].format(inert(text)) for style, text in spans)


def _code(text: str) -> str:
    """`text` as an inline code span: one line, between more backticks than any run of them in it."""
    text = plain(text)
    ticks = "`" * (1 + max((len(run) for run in BACKTICKS.findall(text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


BACKTICKS = re.compile("`+")


def markdown(blocks: list) -> str:
    """A document as Markdown: its blocks, a blank line apart."""
    out = []
    for kind, content in blocks:
        if kind in ("h1", "h2"):
            out.append(("# " if kind == "h1" else "## ") + _md(content))
        elif kind == "p":
            out.append(_md(content))
        elif kind == "list":
            out.append("\n".join(f"- {_md(item)}" for item in content))
        elif kind == "table":
            head, rows = content
            out.append("\n".join([f"| {' | '.join(head)} |", f"|{' --- |' * len(head)}",
                                  *[f"| {' | '.join(_md(c) for c in row)} |" for row in rows]]))
        elif kind == "code":
            # A fence longer than any run of backticks in it: a line of them (a hand-in's exception
            # text, its log) cannot close it and write the page's own Markdown
            fence = "`" * max(3, 1 + max((len(run) for run in BACKTICKS.findall(content)), default=0))
            out.append(f"{fence}\n{content}\n{fence}")
        elif kind == "hr":
            out.append("---")
    return "\n\n".join(out) + "\n"


def check_line(o, label: str = None) -> str:
    """One check's line as a Markdown list item (Gradescope's tests)."""
    return f"- {_md(check_spans(o, label))}"


def feedback_markdown(result: dict, public_only: bool = False) -> str:
    """feedback.md: the student's feedback in Markdown."""
    return markdown(feedback_document(result, public_only))


def feedback_html(result: dict) -> str:
    """feedback.html: the same feedback as a page (escaped by the template's autoescape)."""
    return page_template(TEMPLATE).render(title=f"Assignment 4: feedback for {student_of(result['student'])}",
                              blocks=feedback_document(result))
