"""The package's structure: a module imports only from its own layer or a lower one (docs/design.md, Layers).

A sub-package (minitf/commands/, minitf/benchmarks/) is one unit: its modules share its layer."""

import ast

import pytest

from .helpers import ROOT

# bottom to top; a module may import from its own layer or a lower one, never from a higher one
LAYERS = [
    {"errors", "config", "io", "runtime"},
    {"tokenizer", "shakespeare", "corpus", "build", "data"},
    {"positions", "attention", "cache", "sampling"},
    {"model"},
    {"checkpoint", "optim", "metrics", "parallel"},
    {"session", "trainer", "generate", "inspection", "evaluate", "hf"},
    {"plotting", "heatmaps", "cli", "explore", "explore_api"},
    {"commands", "benchmarks", "__main__"},  # the command line: minitf <command>, minitf bench's measurements
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def minitf_imports(path, package: tuple[str, ...] = ()) -> set[str]:
    """Names of the minitf modules or sub-packages a file imports (relative or absolute); package
    is the file's sub-package under minitf/ (() for a top-level module), for relative imports."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # level 1: this file's package, 2: its parent, ...
                parts = [*package[: len(package) - node.level + 1], *filter(None, mod.split("."))]
            elif mod == "minitf" or mod.startswith("minitf."):
                parts = mod.split(".")[1:]
            else:
                continue
            out |= {parts[0]} if parts else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("minitf.")}
    return out


def unit(path) -> str:
    """The layer unit of a file: its module name, or the sub-package it is in."""
    rel = path.relative_to(ROOT / "minitf")
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


MODULES = sorted(
    p for p in (ROOT / "minitf").rglob("*.py") if p.relative_to(ROOT / "minitf").as_posix() != "__init__.py"
)


def test_every_module_has_a_layer():
    assert {unit(p) for p in MODULES} == set(LEVEL)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(ROOT / "minitf").as_posix())
def test_imports_point_down(path):
    me = unit(path)
    package = path.relative_to(ROOT / "minitf").parts[:-1]
    up = {m for m in minitf_imports(path, package) if LEVEL.get(m, -1) > LEVEL[me]}
    assert not up, f"{path.name} (layer {LEVEL[me]}) imports from a higher layer: {sorted(up)}"


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "model.py"
    bad.write_text("from .trainer import train\nimport minitf.plotting\nfrom . import checkpoint\n")
    assert minitf_imports(bad) == {"trainer", "plotting", "checkpoint"}


def test_the_checker_follows_sub_packages(tmp_path):
    cmd = tmp_path / "train.py"
    cmd.write_text("from . import bench\nfrom ..trainer import train\nfrom .. import plotting\nimport minitf.cli\n")
    assert minitf_imports(cmd, ("commands",)) == {"commands", "trainer", "plotting", "cli"}
    low = tmp_path / "config.py"
    low.write_text("from .commands.train import main\n")
    assert minitf_imports(low) == {"commands"}  # so config.py importing a command is caught
