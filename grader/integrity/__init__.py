"""Integrity: the pairs of hand-ins a person should compare, from evidence only this grader has.

    python -m grader integrity OUT [PATH...] [--base FILE]

Reads what `grade` wrote into OUT (and the hand-ins under PATH, the same ones given to `grade`);
re-runs nothing. Four kinds of evidence (the same run, the same wrong weight, the same code, the
same code sha256), each reported on its own, made by these modules:

    tokens    a statement as normalised tokens: names, numbers, strings, annotations, layout out (tokens.py)
    canon     a file's statements from its syntax tree, each block in a canonical order (canon.py)
    code      what a hand-in wrote beyond the skeleton, normalised and fingerprinted (code.py)
    facts     one hand-in's evidence: its run's provenance, its wrong weights, its code (facts.py)
    similar   the all-pairs comparison of the code fingerprints (similar.py)
    evidence  the four kinds over all pairs, and the pairs they make (evidence.py)
    report    integrity.csv and integrity.md, and the note summary.md carries (report.py)
    commands  the command (commands.py)

The report is evidence for a person to weigh, never a verdict: nothing here changes a grade.
"""
