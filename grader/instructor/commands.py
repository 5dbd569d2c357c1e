"""`python -m grader skeleton`, `release` and `public-rubric`: the instructor's commands."""

import sys

from grader.instructor import skeleton
from grader.kit import ROOT
from grader.rubric import RubricError


def skeleton_command(args) -> int:
    name = skeleton.SKELETON.relative_to(ROOT)
    if args.check:
        if skeleton.skeleton_is_current():
            print(f"{name} is generated from the reference: up to date")
            return 0
        print(f"{name} differs from what the reference generates; run `python -m grader skeleton` "
              f"(or `make skeleton`) and commit the result", file=sys.stderr)
        return 1
    changed = skeleton.write_skeleton()
    print(f"{name} {'written' if changed else 'already up to date'}")
    return 0


def release_command(args) -> int:
    from grader.instructor.release import ReleaseError, build_release
    try:
        summary = build_release(args.out, replace=args.replace)
    except (ReleaseError, RubricError) as e:
        print(f"release: refused: {e}", file=sys.stderr)
        return 2
    print(f"wrote the student release to {summary.out}: {len(summary.files)} files "
          f"(grader rooms: {', '.join(summary.rooms)})")
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
