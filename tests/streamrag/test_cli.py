"""The `streamrag` command table: every row names functions that exist, and becomes one command
that runs its own handler."""

from __future__ import annotations

import argparse
import ast
import importlib.util
from pathlib import Path

import pytest

from streamrag import cli


def defines(target: str) -> bool:
    """Whether `module:function` names a function defined at the top of that module (read, not imported)."""
    module, _, name = target.partition(":")
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"no module {module}"
    tree = ast.parse(Path(spec.origin).read_text())
    return any(isinstance(node, ast.FunctionDef) and node.name == name for node in tree.body)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


@pytest.mark.parametrize("command", cli.COMMANDS, ids=lambda c: c.path)
def test_each_row_names_functions_that_exist(command: cli.Command):
    assert defines(command.args), command.args
    assert defines(command.run), command.run
    words = command.path.split()
    assert len(words) == 1 or (len(words) == 2 and words[0] in cli.GROUPS)


def test_each_row_is_one_command_that_runs_its_own_handler(monkeypatch):
    parser = cli.build_parser()
    ran = []
    monkeypatch.setattr(cli, "resolve", lambda target: lambda args: ran.append(target) or 0)
    for command in cli.COMMANDS:
        sub = parser
        for word in command.path.split():
            sub = subcommands(sub)[word]
        assert sub.get_default("handler")(argparse.Namespace()) == 0
    assert ran == [command.run for command in cli.COMMANDS]
    assert len({command.path for command in cli.COMMANDS}) == len(cli.COMMANDS)


def every_parser(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and every subcommand's parser under it, at any depth."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += every_parser(sub)
    return found


def test_no_parser_takes_an_abbreviated_flag(capsys):
    """Every parser is built with allow_abbrev=False: a flag is spelled out or refused, so a flag added later
    (`--seeds`) cannot swallow a caller's other one (`--seed`, which `bench blend` once passed to the replay)."""
    parsers = every_parser(cli.build_parser())
    assert len(parsers) > len(cli.COMMANDS)
    assert [p.prog for p in parsers if p.allow_abbrev] == []
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["bench", "replay", "--trace", "t.jsonl", "--qps", "1", "--seed", "0",
                                        "--out", "o"])
    assert "unrecognized arguments: --seed" in capsys.readouterr().err
