"""a4 grader: from hand-in zips to grades, feedback and Gradescope results.

The house, one room per job; a hand-in travels down the list:

    shared       kit (paths, atomic writes, the source digest), parts, rubric (and its limits),
                 results (statuses and result dataclasses, where a batch keeps them), plots (figures
                 by matplotlib, loaded only to draw; the lab's bandwidth plot uses it too), cli
    rerun/       the engine: run hand-in code in gloo worlds inside a sandbox (bwrap) and bring back
                 its weights (executor, torchrun, zygote, world, supervise, worker, source, secret,
                 layer, block, hooks, protocol, channel, sandbox, scratch, memory, check; hidden
                 keeps a hidden check's results free of a rank's words; doctor says which sandbox
                 layers work on a machine)
    pipeline/    grade one hand-in: intake and download (what a download holds), handin (unpack),
                 runs (a run's stdout and stderr, found by what they hold), logtext, logfile and
                 errfile (what they say), compare and diagnose (the weights), backward (the
                 tensor-parallel layer's gradients), megatron (the optional Part 5's block), score,
                 say (what a student may see of hidden checks), report, grade
    batch/       grade many: on this machine (local), as a Slurm job array (array), into OUT (run),
                 grades.csv, summary.md and the staff report over every result in OUT (gradebook)
    grades/      final grades from graded results: the course policy (deadline, late penalty,
                 extensions, overrides), submission times, roster, LMS files (book, policy, sources,
                 lms), and what a regrade moved (diff)
    student/     the student tools: check and package
    gradescope/  grading inside Gradescope's container, and the bundle that sets it up
    instructor/  the skeleton generated from the reference, the configuration check, the student
                 release and the public rubric it ships (derived from rubric.yaml)
    analytics/   the batch report for course staff: item analytics over every result in OUT
                 (numbers) as report.html with its plots and analytics.json (page)
    integrity/   the pairs of hand-ins a person should compare, from graded results and the hand-ins
                 (code, facts, similar, evidence, report); it runs no code

Import rules (tests/test_layout.py holds the code to them):
- shared modules import no torch and no room; nothing imports cli, and cli imports a command's room
  only when that command runs;
- rerun imports only shared modules; pipeline adds rerun;
- batch, student and gradescope may use everything above (batch also analytics), never each other;
- instructor imports only shared modules (no engine, no pipeline);
- grades imports only shared modules and analytics: it reads results, never runs code;
- analytics imports only shared modules (it reads results; matplotlib only to draw);
- integrity imports shared modules and pipeline (to unpack hand-ins and read their logs), and
  analytics (to give the staff report its count of pairs);
- no module imports, directly or not, one that imports it.
"""

__version__ = "0.1.0"
