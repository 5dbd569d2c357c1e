"""One hand-in through the rooms: unpacked (grader.intake), its logs read (grader.evidence), re-run
(grader.rerun), judged and scored (grader.verdict) by `grade`, and its files written by `report`."""
