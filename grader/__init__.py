"""a4 grader: from hand-in zips to grades, feedback and Gradescope results.

The house, one room per job; a hand-in travels down the list. Every module is named under its
room (tests/test_layout.py holds the map to that):

    shared       kit (paths, atomic writes, the source digest), parts (below), rubric (the loader, and
                 the public rubric derived from it; feasible: what no rubric can have and whether
                 the kit can run its checks, every problem refused at once; worth: what a check
                 is worth, the one rounding of scores, what the hidden checks hold) and limits (what
                 a world may use, each timeout's default, a batch's part clock, --jobs from the
                 machine, and what a Slurm grading task asks for: all that the re-run's processes
                 read of the rubric),
                 outline (a hand-in's code parsed where a limit holds: a child process's, or a
                 deep stack under the size caps),
                 results (statuses and result dataclasses, where a batch keeps them, and whether a
                 batch could be graded at all: its canary, OUT/canary.json), names (where a hand-in's results live in OUT, under a key made of its id; names
                 from a download made inert), lmss (every LMS, one record each: its download's names
                 and reader, its grade file's filler, what the kit says of it), typed (dataclasses from plain data and back: the one
                 validator), plots (figures by matplotlib, loaded only to draw; the lab's bandwidth
                 plot uses it too), cli (the command line; __main__ runs it)
    parts/       shared too: the parts of the assignment, a module each holding all the grader knows of
                 that part, as its record's data and hooks (baseline, grad_accumulation,
                 data_parallel, tensor_parallel, megatron_mlp, vocab_parallel, transformer_block,
                 sequence_parallel);
                 common (the layouts' names, the usual hooks and what the hooks share); the registry and the kinds of check in its __init__
    rerun/       the engine: run hand-in code in gloo worlds inside a sandbox and bring back its
                 weights. On the grader's side, the executors (executor, executors, torchrun)
                 start zygote, the warm helper (startup: its environment and the refusals to start
                 it; bwrap: the job sandbox built around it, and the engine's files staged in it),
                 and send each world the code an earlier one compiled (compiled); check runs
                 a hand-in's parts at one check, hangs says who waited for whom when a part hung,
                 starved whether a part past its clock hung or was kept from the CPU; machine says
                 why a machine cannot grade. Inside the sandbox, zygote forks a world (world), whose
                 leader supervise runs its parts (ending: its ranks reaped, the rest killed).
                 Three wings beside them, each importing no module above it:
                 sandbox/, what holds a hand-in inside the job sandbox: namespaces the world's
                 own, scratch its fresh /tmp, cgroup its limits, memory its watchdog (pss: what
                 /proc says of each process; outside: what the world holds beyond their Pss, its
                 sockets' buffers by sockets), tasks its count of processes and threads, sweep
                 (without the sandbox, a world's processes and files ended with it), environment
                 (the variables a rank and the helper get), readable (code and Python the ranks'
                 user can read);
                 wire/, what crosses between the grader and the ranks: protocol types the messages
                 and channel frames them, bounds holds what a rank sends back to its part's size,
                 secret derives each part's data by its layout (model_data: the optional Part 7's
                 tiny transformer), hidden keeps a hidden check's results free of a rank's words;
                 rank/, what runs inside a rank: store is where a world's ranks meet to join
                 gloo, worker loads the code (source) and runs what the
                 part's record says at the check's kind (a step, a layer alone), wrapped in hooks
                 (its spy reads each call by collectives, every way a collective is reached, the
                 dispatcher's ops too), and errors says what the hand-in raised; syscalls refuses
                 every rank the calls that make memory no Pss shows
    intake/      from the paths a TA gives to hand-ins: find (which paths are downloads, which
                 hand-ins), download (whose each file of an LMS download is; attempts: Blackboard's,
                 one hand-in per attempt), listing (a folder's or
                 a zip's files, each read from disk only when used), handin (unpack safely, locate
                 the code and the runs)
    evidence/    the logs, as evidence and never the verdict: runs (a run's stdout and stderr,
                 found by what they hold, and which run counts), logfile and errfile (what they
                 say), logtext (the patterns and reports both share)
    verdict/     the re-run judged in the grader's own process, each part as its record names
                 (judging): compare and diagnose (the weights),
                 backward (the tensor-parallel layer's gradients), megatron (the optional Part 5's
                 block), vocab (the optional Part 6's loss and gradients), transformer (the optional
                 Part 7's block) and transformer_step (its tiny transformer's step), sequence (the
                 optional Part 8's sequence-parallel block), comm (a parallel part's collectives:
                 right values count only with them, a capped one no more), carried (what
                 those collectives carried: the values the part's algorithm moves),
                 say (what a student may see of hidden checks), score (the points)
    pipeline/    one hand-in through those rooms and the engine (grade), and its files: grading.json,
                 Gradescope's results.json (report), feedback.md and feedback.html (feedback, its
                 page from templates/), written by record alone, the one way a batch, an array task
                 and Gradescope grade a hand-in into its folder; the reference re-run and judged at every check before a batch,
                 and when it fails, why: its code, the rubric's limits, the machine (canary); doctor
                 runs a world of the reference here, says what holds, and checks its answers;
                 peak measures what a world of the reference used, from outside
    batch/       grade many: on this machine (local), as a Slurm job array (array), into OUT (run),
                 each collecting only statuses; grades.csv, summary.md and the staff report over
                 every result in OUT, read back from disk (outputs);
                 commands (the `grade` command); the progress line and its ETA (progress)
    grades/      final grades from graded results: the course policy (deadline, late penalty,
                 extensions, overrides), submission times, roster (book, policy, sources), the grade
                 each student is told and why (statement), each LMS's import (lms/: canvas, moodle,
                 blackboard, gradescope, read and written back by sheet, named by imports) and
                 feedback uploads (feedback), what a regrade moved (diff); commands (`gradebook`
                 and `diff`)
    student/     the student tools: check and package; commands (their two commands)
    gradescope/  grading inside Gradescope's container (run), and the bundle that sets it up (bundle)
    instructor/  the skeleton generated from the reference (skeleton), the handout's points written
                 from the rubric (handout), the configuration said alike in the reference, the
                 rubric and the handout (config), the lab's answers to the assignment (lab), the
                 release's scan for leaks (leaks), the student release and the public rubric file it
                 ships (release); commands (`skeleton`, `release`, `public-rubric`)
    analytics/   the batch report for course staff: a row per hand-in, worst first (triage), item
                 analytics over every result in OUT (numbers), as report.html from templates/ with
                 its plots, and analytics.json (page)
    integrity/   the pairs of hand-ins a person should compare, from graded results and the hand-ins
                 (tokens, canon, code, facts, similar, evidence, report; commands, the `integrity`
                 command); it runs no code

Import rules (tests/test_layout.py holds the code to them):
- shared modules import no torch and no room (a part's hooks import torch when called, never at the
  top); nothing imports cli, and cli imports a command's room
  only when that command runs;
- rerun and evidence import only shared modules; of rerun's wings, wire and sandbox import no other
  wing, rank imports those two, and no wing imports the room's own modules (the executor's side);
- intake adds evidence (a hand-in's runs are found by what they hold); verdict adds rerun and
  evidence; pipeline adds all four;
- batch, student and gradescope may use everything above (batch also analytics), never each other;
- instructor imports only shared modules (no engine, no pipeline);
- grades imports only shared modules and analytics: it reads results, never runs code;
- analytics imports only shared modules (it reads results; matplotlib only to draw);
- integrity imports shared modules, intake and evidence (to unpack hand-ins and read their logs),
  and analytics (to give the staff report its count of pairs);
- evidence, intake, integrity, grades, analytics, instructor and the shared modules import no torch;
- no module imports, directly or not, one that imports it;
- beside the package, slurm/ and lab/ import only shared modules (slurm's cluster profiles are built
  by typed, as the rubric is; the lab draws through plots), and no grader module imports them.
"""

__version__ = "0.1.0"
