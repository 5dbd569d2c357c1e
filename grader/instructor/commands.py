"""`python -m grader skeleton`, `release` and `public-rubric`: the instructor's commands."""

import sys

from grader.instructor import skeleton
from grader.kit import ROOT
from grader.rubric import RubricError


def skeleton_command(args) -> int:
    """The generated files of the kit: the skeleton from the reference, the handout's points from
    the rubric (grader.instructor.handout)."""
    from grader.instructor import handout
    from grader.rubric import load_rubric
    name, readme = skeleton.SKELETON.relative_to(ROOT), handout.HANDOUT.relative_to(ROOT)
    try:
        rubric = load_rubric()
    except RubricError as e:
        print(f"skeleton: {e}", file=sys.stderr)
        return 2
    if args.check:
        stale = [f"{name} differs from what the reference generates"] if not skeleton.skeleton_is_current() else []
        stale += [] if handout.points_are_current(rubric) else [f"{readme}'s points differ from grader/rubric.yaml's"]
        if not stale:
            print(f"{name} is generated from the reference, {readme}'s points from the rubric: up to date")
            return 0
        print("; ".join(stale) + ": run `python -m grader skeleton` (or `make skeleton`) and commit the result",
              file=sys.stderr)
        return 1
    changed = skeleton.write_skeleton()
    print(f"{name} {'written' if changed else 'already up to date'}")
    print(f"{readme}'s points {'written' if handout.write_points(rubric) else 'already up to date'}")
    return 0


def release_command(args) -> int:
    from grader.instructor.release import ReleaseError, build_release
    try:
        summary = build_release(args.out, replace=args.replace, lab_answers=args.lab_answers)
    except (ReleaseError, RubricError) as e:
        print(f"release: refused: {e}", file=sys.stderr)
        return 2
    print(f"wrote the student release to {summary.out}: {len(summary.files)} files "
          f"(grader rooms: {', '.join(summary.rooms)})")
    if summary.lab_answers:
        print("the lab's files that answer the assignment, " + ("shipped (--lab-answers):" if summary.lab_shipped
                                                                 else "left out (--lab-answers ships them):"))
        for path, what in summary.lab_answers.items():
            print(f"  {path}: {what}")
    return 0


def public_rubric_command(args) -> int:
    from grader import kit
    from grader.instructor.release import public_rubric_text
    from grader.rubric import load_rubric
    try:
        text = public_rubric_text(load_rubric(args.rubric))
    except RubricError as e:
        print(f"public-rubric: {e}", file=sys.stderr)
        return 2
    if args.output:
        kit.atomic_write(args.output, text)
        print(f"wrote the public rubric to {args.output}")
    else:
        print(text, end="")
    return 0
