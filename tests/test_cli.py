"""The command line: every command and every option says what it does, without the README."""

import argparse
import subprocess
import sys

import pytest

from grader import cli, kit


def subcommands() -> dict:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices), {a.dest: a.help for a in action._choices_actions}


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_and_option_has_a_help_text(name):
    parsers, helps = subcommands()
    assert name in parsers, f"{name}: its room is missing from this tree"
    assert helps[name] and len(helps[name]) > 20, name
    parser = parsers[name]
    assert parser.description and parser.description != parser.prog, name
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and len(action.help) > 10, (name, action.dest)


def test_help_loads_no_room(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)


def test_help_groups_every_command_once_by_who_runs_it(capsys):
    assert {room for room, *_ in cli.COMMANDS.values()} == set(cli.READERS), "a room without a reader"
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    groups = capsys.readouterr().out.split("commands by who runs them")[1].splitlines()[1:]
    listed = [name for line in groups if ":" in line for name in line.rsplit(":", 1)[1].replace(",", " ").split()]
    assert sorted(listed) == sorted(cli.COMMANDS), groups


def test_without_torch_a_command_points_to_a_guide_this_tree_holds():
    from grader import kit
    assert (kit.ROOT / cli.install_guide().split(",")[0]).is_file()
    # check imports the engine only once it re-runs code: it too is refused with the message
    code = ("import sys\nsys.modules['torch'] = None\nfrom grader import cli\n"
            "sys.exit(cli.main(['check', 'assignment_4/reference']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=kit.ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "needs torch" in done.stderr and cli.install_guide() in done.stderr, done.stderr


@pytest.mark.torch
def test_the_command_line_defaults_are_the_functions_defaults():
    import inspect

    from grader.batch.array import grade_on_slurm
    from grader.batch.run import grade_batch
    from grader.gradescope.run import grade_submission
    parser = cli.build_parser()
    grade = parser.parse_args(["grade", "x", "--out", "o"])
    for option, parameter in [("jobs", "jobs"), ("executor", "executor"), ("sandbox", "sandbox"),
                              ("array_parallelism", "array_parallelism"), ("chunk", "chunk")]:
        function = grade_batch if parameter in inspect.signature(grade_batch).parameters else grade_on_slurm
        assert getattr(grade, option) == inspect.signature(function).parameters[parameter].default, option
    # --jobs unsaid: this machine's share (kit.JOBS, None: grader.limits.default_jobs), and in each
    # array task kit.TASK_JOBS, which what a task asks Slurm for is sized by.
    assert inspect.signature(grade_batch).parameters["jobs"].default is kit.JOBS is None
    assert inspect.signature(grade_on_slurm).parameters["jobs"].default == kit.TASK_JOBS
    gradescope = parser.parse_args(["gradescope"])
    for option in ("submission", "results", "metadata"):
        assert getattr(gradescope, option) == inspect.signature(grade_submission).parameters[option].default, option


def test_a_slurm_tasks_time_cpus_and_memory_follow_the_rubric_and_jobs_and_the_help_quotes_them(capsys):
    from grader.limits import HANDIN_SECONDS, Limits, slurm_task
    stock = slurm_task(kit.ARRAY_CHUNK, kit.TASK_JOBS)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["grade", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert str(stock) in text and f"{stock.mem_gb} GB" in text
    # Every hand-in of the chunk may run out its timeout, --jobs at once, after the canary.
    assert stock.minutes * 60 >= (kit.ARRAY_CHUNK / kit.TASK_JOBS + 1) * HANDIN_SECONDS
    assert slurm_task(10, 1, handin_s=1200).minutes > slurm_task(10, 1).minutes > slurm_task(10, 2).minutes
    assert slurm_task(10, 2, memory_mb=8192).mem_gb > slurm_task(10, 2).mem_gb > slurm_task(10, 1).mem_gb
    assert slurm_task(10, 4).cpus == 4 and slurm_task(10, 1, memory_mb=Limits.memory_mb).cpus == 2
