"""Blackboard's downloads: one hand-in per attempt, each file told apart by the name Blackboard
gave it (grader.intake.download: `Assignment_user_attempt_DATE_ORIG`, and a receipt
`Assignment_user_attempt_DATE.txt` per attempt).

Blackboard wrote the name's first `_attempt_<date>`; the file's own name (ORIG) comes after it, and
a student may name a file anything, `x_vic_attempt_<date>_handin.zip` too. What comes before it is
`Assignment_user`, and both may hold underscores (`HW_4`, `jo_doe`). The assignment is one for the
whole download: as the receipts say it (a receipt's first lines, `Name: First Last (user)` and
`Assignment: ...`, are Blackboard's; what the student typed comes below them), else the names'
common start where only one underscore in it could end the assignment. A name that does not fit
that assignment, one whose receipt names another user, and one that cannot be read at all fit no
student: each is a Stray, said and never graded as anybody.
"""

import os
import re

from grader.intake.download import DownloadError, Entry, Shape, Stray, add_file
from grader.intake.listing import Listing
from grader.lmss import Lms

RECEIPT = re.compile(r"^(?:Name:.*\((?P<user>[^()]+)\)|Assignment:(?P<title>.+))\s*$")
RECEIPT_HEAD = 4   # the receipt's lines Blackboard writes before anything the student typed


def read_blackboard(listing: Listing, lms: Lms) -> Shape:
    """Each attempt a hand-in, its files by the module docstring's reading of their names."""
    named = {rel: lms.match(rel) if "/" not in rel else None for rel in listing.paths}
    heads = {}   # "Assignment_user" -> {date: (user, assignment) as that attempt's receipt says them}
    for rel, match in named.items():
        if match:
            receipts = heads.setdefault(_head(match), {})
            if match["txt"]:
                receipts[match["date"]] = _receipt(listing, rel)
    title = assignment_name(heads)
    shape, entries = Shape(lms.name), {}
    for rel, match in named.items():
        user, why = _user(match, title, heads)
        if why:
            shape.strays.append(Stray(listing.where(rel), f"{listing.where(rel)}: {why}; not graded"))
            continue
        date, attempt = match["date"], f"{_head(match)}_attempt_{match['date']}"
        entry = entries.setdefault((user, date), Entry(user, listing.where(attempt), lms.name, upload=attempt,
                                                       submitted_at=f"{date[:10]}T{date[11:].replace('-', ':')}"))
        if not match["txt"]:
            add_file(entry, match["orig"], listing, rel, shape.strays)
    shape.entries = [e for e in entries.values() if e.files]
    shape.strays += [Stray(e.name, f"{e.name}.txt: an attempt with no file; nothing to grade")
                     for e in entries.values() if not e.files]
    return shape


def assignment_name(heads: dict) -> str:
    """The download's one assignment name, of its attempts' heads ("Assignment_user" -> {date:
    (user, assignment) its receipt says}): the one the receipts give most, each read where it fits
    its head (the assignment the head starts with, else the head less the user it ends with); else
    the heads' common start where one underscore alone could end it; else ""."""
    said = []
    for head, receipts in heads.items():
        for user, title in receipts.values():
            if title and head.startswith(title + "_"):
                said.append(title)
            elif user and head.endswith("_" + user) and len(head) > len(user) + 1:
                said.append(head[:-len(user) - 1])
    if said:
        return max(set(said), key=said.count)
    common = os.path.commonprefix(list(heads))
    cuts = [i for i, c in enumerate(common) if c == "_" and i and all(len(h) > i + 1 for h in heads)]
    return common[:cuts[0]] if len(cuts) == 1 else ""


def _head(match) -> str:
    return f"{match['assignment']}_{match['id']}"


def _receipt(listing: Listing, rel: str) -> tuple:
    """(user, assignment) as a receipt's first lines say them, "" for what they do not."""
    try:
        lines = listing.read(rel)[:2048].decode("utf-8-sig", "replace").splitlines()[:RECEIPT_HEAD]
    except DownloadError:
        return "", ""
    found = [m for m in map(RECEIPT.match, lines) if m]
    return tuple(next((m[key].strip() for m in found if m[key]), "") for key in ("user", "title"))


def _user(match, title: str, heads: dict) -> tuple:
    """(the username an attempt's file is of, "") or ("", why it fits no student)."""
    if not match:
        return "", "not named as Blackboard names an attempt's file (Assignment_user_attempt_date_name)"
    if not title:
        return "", "no receipt (.txt) tells which part of the names is the assignment, which the user"
    head = _head(match)
    if not head.startswith(title + "_"):
        return "", f"not of the download's assignment ({title})"
    user, said = head[len(title) + 1:], heads[head].get(match["date"], ("", ""))[0]
    return ("", f"its receipt says it is {said}'s") if said not in ("", user) else (user, "")
