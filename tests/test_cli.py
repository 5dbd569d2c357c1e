"""The command line: every command and every option says what it does, without the README."""

import argparse

import pytest

from grader import cli


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
