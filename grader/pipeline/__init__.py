"""Grade one hand-in: unpack it, read its logs, re-run it, compare, score, report."""
