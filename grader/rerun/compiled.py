"""The grader's side of compiling a hand-in once: the code its first world's leader compiled, sent
with each later world of the same code (WorldJob's `compiled`).

A world's leader parses and compiles assignment4.py before it forks the ranks, about 50 ms of the
reference's world (ast.parse alone is two thirds), and the trusted utils.py beside it, 2 ms to
3 ms; a hand-in runs in some 15 worlds. The leader of a world sent without them compiles both and
returns the result in its report (grader.rerun.rank.source.compiled_blob); the executor keeps it
here, under the digest of the files it came from, and sends it with the next world of those
files, whose leader loads it (under 2 ms) and compiles again only if it cannot. The grader never
reads it: it is text to keep and send back, made by a leader, which no rank can reach, before any
rank was forked.
"""

import collections
import dataclasses
import hashlib
import json

from grader.rerun.wire.protocol import WorldJob, WorldReport

KEPT = 8   # the code of the last few hand-ins (an executor grades one at a time)


def digest(code: dict) -> str:
    """The digest of a world's files (file name -> text)."""
    return hashlib.sha256(json.dumps(code, sort_keys=True).encode("utf-8", "surrogatepass")).hexdigest()


class Compiled:
    """An executor's compiled code, by the digest of the files it was compiled from."""

    def __init__(self):
        self._kept = collections.OrderedDict()

    def with_compiled(self, job: WorldJob) -> tuple:
        """(job with the compiled code of its files where kept, the files' digest)."""
        key = digest(job.code)
        blob = self._kept.get(key)
        if blob is None:
            return job, key
        self._kept.move_to_end(key)
        return dataclasses.replace(job, compiled=blob), key

    def keep(self, key: str, report: WorldReport) -> WorldReport:
        """Keep what the world's leader compiled (if it did), and hand back the report without it."""
        if report.compiled:
            self._kept[key] = report.compiled
            self._kept.move_to_end(key)
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)
            report.compiled = ""
        return report
