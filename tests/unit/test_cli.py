"""The `minitf` command: one front door over the same code as scripts/*.py, with their one-line errors."""

import ast
import re

import pytest

from minitf.cli import COMMANDS
from tests.support import ROOT
from tests.support.errors import exit_code


def test_help_lists_every_command(capsys):
    assert exit_code(["--help"]) == 0
    out = capsys.readouterr().out
    for name, (_, line) in COMMANDS.items():
        assert f"  {name} " in out and line in out
    assert exit_code([]) == 2 and "usage: minitf <command>" in capsys.readouterr().err


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help(name, capsys):
    assert exit_code([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: minitf {name} ") and "--" in out


def test_unknown_command_is_one_line(capsys):
    assert exit_code(["trian"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: unknown command 'trian' (did you mean 'train'?); the commands are {', '.join(COMMANDS)}\n"


@pytest.mark.parametrize("script", sorted((ROOT / "scripts").glob("*.py")), ids=lambda p: p.name)
def test_every_script_is_a_thin_front_to_a_command(script):
    """scripts/<name>.py runs minitf.cli.<command>.main through run_main, and nothing else."""
    tree = ast.parse(script.read_text())
    imports = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    (module,) = {m for m, name in imports if name == "main"}
    assert module.removeprefix("minitf.cli.") in {m for m, _ in COMMANDS.values()}
    assert ("minitf.cli.common", "run_main") in imports and "run_main(main)" in script.read_text()
    assert sum(isinstance(n, ast.FunctionDef) for n in ast.walk(tree)) == 0  # the logic lives in the package


def test_every_command_has_a_script():
    front = re.compile(r"from minitf\.cli\.(\w+) import main")
    scripts = {front.search(p.read_text())[1] for p in (ROOT / "scripts").glob("*.py")}
    assert scripts == {m for m, _ in COMMANDS.values()}
