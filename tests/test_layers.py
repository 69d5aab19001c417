"""The package's structure: a module imports only from its own layer or a lower one (docs/design.md, Layers)."""

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
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def minitf_imports(path) -> set[str]:
    """Names of the minitf modules a file imports (relative or absolute)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1 or mod.startswith("minitf"):
                parts = mod.split(".")[1:] if mod.startswith("minitf") else mod.split(".")
                out |= {parts[0]} if parts and parts[0] else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("minitf.")}
    return out


MODULES = sorted(p for p in (ROOT / "minitf").glob("*.py") if p.stem != "__init__")


def test_every_module_has_a_layer():
    assert {p.stem for p in MODULES} == set(LEVEL)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_imports_point_down(path):
    up = {m for m in minitf_imports(path) if LEVEL.get(m, -1) > LEVEL[path.stem]}
    assert not up, f"{path.name} (layer {LEVEL[path.stem]}) imports from a higher layer: {sorted(up)}"


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "model.py"
    bad.write_text("from .trainer import train\nimport minitf.plotting\nfrom . import checkpoint\n")
    assert minitf_imports(bad) == {"trainer", "plotting", "checkpoint"}
