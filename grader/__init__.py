"""a4 grader: from hand-in zips to grades, feedback and Gradescope results.

The house, one room per job; a hand-in travels down the list:

    shared       kit (paths, atomic writes, the source digest), parts, rubric (and its limits),
                 results (statuses and result dataclasses, where a batch keeps them), plots (figures
                 by matplotlib, loaded only to draw; the lab's bandwidth plot uses it too), cli
    rerun/       the engine: run hand-in code in gloo worlds inside a sandbox (bwrap) and bring back
                 its weights (executor, executors, torchrun, zygote, world, supervise, worker, source, secret,
                 layer, block, hooks, protocol, channel, sandbox, scratch, check; what holds a world:
                 memory, tasks, cgroup, environment, readable; hidden keeps a hidden check's results
                 free of a rank's words; machine says why a machine cannot grade, doctor runs a world
                 of the reference there and says what holds)
    intake/      from the paths a TA gives to hand-ins: find (which paths are downloads, which
                 hand-ins), download (whose each file of an LMS download is), handin (unpack safely,
                 locate the code and the runs)
    evidence/    the logs, as evidence and never the verdict: runs (a run's stdout and stderr,
                 found by what they hold, and which run counts), logfile and errfile (what they
                 say), logtext (the patterns and reports both share)
    verdict/     the re-run judged in the grader's own process: compare and diagnose (the weights),
                 backward (the tensor-parallel layer's gradients), megatron (the optional Part 5's
                 block), say (what a student may see of hidden checks), score (the points)
    pipeline/    one hand-in through those rooms and the engine (grade), and its files: grading.json,
                 feedback.md, Gradescope's results.json (report)
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
- rerun and evidence import only shared modules; intake adds evidence (a hand-in's runs are found
  by what they hold); verdict adds rerun and evidence; pipeline adds all four;
- batch, student and gradescope may use everything above (batch also analytics), never each other;
- instructor imports only shared modules (no engine, no pipeline);
- grades imports only shared modules and analytics: it reads results, never runs code;
- analytics imports only shared modules (it reads results; matplotlib only to draw);
- integrity imports shared modules, intake and evidence (to unpack hand-ins and read their logs),
  and analytics (to give the staff report its count of pairs);
- evidence, intake, integrity, grades, analytics, instructor and the shared modules import no torch;
- no module imports, directly or not, one that imports it.
"""

__version__ = "0.1.0"
