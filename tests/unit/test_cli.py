"""The `minitf` command: one front door over the same code as scripts/*.py, with their one-line errors."""

import ast
import os
import re
import subprocess
import sys

import pytest

from minitf.cli import COMMANDS, main

from .helpers import ROOT


def _exit_code(argv) -> int:
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code


def test_help_lists_every_command(capsys):
    assert _exit_code(["--help"]) == 0
    out = capsys.readouterr().out
    for name, (_, line) in COMMANDS.items():
        assert f"  {name} " in out and line in out
    assert _exit_code([]) == 2 and "usage: minitf <command>" in capsys.readouterr().err


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help(name, capsys):
    assert _exit_code([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: minitf {name} ") and "--" in out


def test_unknown_command_is_one_line(capsys):
    assert _exit_code(["trian"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: unknown command 'trian' (did you mean 'train'?); the commands are {', '.join(COMMANDS)}\n"


def test_train_help_gives_every_key_its_meaning(capsys):
    assert _exit_code(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "    model.n_embd = 128" in out and "width of the residual stream" in out
    # choices, and the recipes by name (argparse wraps the list where its length puts the line ends)
    assert "[adamw|muon]" in out and "induction, nanogpt-cpu" in " ".join(out.split())


def test_the_plain_train_run_is_the_default_config(monkeypatch):
    """`minitf train` (and scripts/train.py, the same function) with no arguments trains load_config()."""
    import minitf.system.runtime
    import minitf.trainer

    seen = []
    monkeypatch.setattr(minitf.trainer, "train", lambda cfg, **kw: seen.append(cfg))
    monkeypatch.setattr(minitf.system.runtime, "keep_freed_memory", lambda: None)
    from minitf.cli import train

    train.main([])
    train.main(["--config", "shakespeare"])
    assert seen == [minitf.load_config(), minitf.load_config()] and seen[0].train.optimizer == "muon"


def test_errors_are_one_line_and_exit_2_through_python_m(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "minitf", "train", "--config", "tinny"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: no config file or recipe named 'tinny'")
    assert r.stderr.count("\n") == 1


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


def test_bench_outside_a_clone_is_one_line(monkeypatch, tmp_path, capsys):
    """bench/ is not in the wheel: an installed minitf with no clone around it says so in one line."""
    import minitf.cli.bench

    monkeypatch.setattr(minitf.cli.bench, "CLONE", tmp_path)  # a top with no bench/cli.py, as site-packages
    assert _exit_code(["bench", "--only", "train"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: minitf bench runs from a clone of the repository") and err.count("\n") == 1


def test_the_bench_script_finds_bench_with_the_clone_already_on_the_path():
    """python scripts/bench.py puts scripts/ first on the path, and its bench.py is no package: the
    clone's bench/ must still be the one imported when the clone is on the path too (PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "scripts/bench.py", "--help"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )
    assert r.returncode == 0 and r.stdout.startswith("usage: bench.py"), r.stderr[-2000:]


def test_datasets_is_imported_only_for_hf_sources(tmp_path):
    """Configuring, training's imports and preparing a local text never import datasets (a slow
    import); an hf: source (here a local parquet directory) does."""
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow comes with datasets")
    import pyarrow as pa

    text = "To be, or not to be, that is the question.\n" * 200
    (tmp_path / "a.txt").write_text(text)
    (tmp_path / "shards").mkdir()
    pq.write_table(pa.table({"text": [text, text]}), tmp_path / "shards" / "part0.parquet")
    code = (
        "import sys, minitf\n"
        "minitf.load_config()\n"
        "import minitf.trainer, minitf.generate, minitf.evaluate, minitf.cli.train\n"
        "from minitf.corpus.prepare import prepare_data\n"
        "quiet = lambda *a: None\n"
        f"prepare_data(minitf.DataConfig(source='file:{tmp_path / 'a.txt'}', vocab_size=300), log=quiet)\n"
        "print('datasets' in sys.modules)\n"
        f"prepare_data(minitf.DataConfig(source='hf:{tmp_path / 'shards'}', vocab_size=300), log=quiet)\n"
        "print('datasets' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MINITF_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "True"]
