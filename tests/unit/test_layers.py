"""The package's structure: a module imports only from its own layer or a lower one (docs/design.md, Layers).

A sub-package (minitf/web/explore/, minitf/cli/, bench/) sits in one layer as a whole: its modules
may import each other, and from minitf what its layer may."""

import ast

import pytest

from tests.support import ROOT

PKG = ROOT / "minitf"


# bottom to top; a module may import from its own layer or a lower one, never from a higher one.
# A sub-package (corpus/, training/, export/, web/, cli/, system/) stands in one layer as a whole.
LAYERS = [
    # the two exceptions, typed configs; device, files, progress, sizes; the time budget's arithmetic
    {"errors", "config", "system", "budget"},
    {"tokenizer"},  # text -> ids
    # the token cache's format as batches (data.py owns it; corpus/ writes it); a conversation's rules,
    # its template and loss mask, the template's sandbox and bounded worker, its contents kept as text,
    # and its batches
    {
        "data",
        "chat_template",
        "conversations.rules",
        "conversations.data",
        "conversations.markers",
        "conversations.sandbox",
        "conversations.bounded",
        "conversations.template_files",
    },
    {"corpus"},  # where text comes from, tokenized once into data.py's token cache: nothing above it
    {"conversations.cache"},  # conversations tokenized once, read through corpus/'s sources
    {"positions", "attention", "fast", "kv_cache", "sampling"},  # the parts of a model and of sampling
    {"model"},  # Transformer = embeddings + positions + blocks + head
    {"generation", "run_dir"},  # generation's arguments and stop strings; a run directory read
    {"optim"},  # optimizers and the schedule: nothing of a run's machinery
    # a run's set-up steps, session, checkpoints, FSDP, logs; a chat fine-tune's; RL's update, rewards and rollouts
    {"training", "conversations.sft", "rl"},
    # what is done with a model and a run
    {
        "trainer",
        "evaluate",
        "generate",
        "conversations.answer",
        "conversations.metrics",
        "inspection",
        "interpret",
        "export",
    },
    {"plots"},  # figures: loss curves, attention heatmaps, interpretability grids (matplotlib, files only)
    {"web"},  # the web apps: the explorer, the OpenAI-compatible server, and their HTTP layer
    {"cli", "__main__"},  # the command line: minitf <command>
]

# minitf/conversations/ spans layers, from a conversation's rules to answering one: each of its
# modules has its own layer, and it is never named as a whole
SPANNING = ("conversations",)


LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def minitf_imports(path, package: tuple[str, ...] = ()) -> set[str]:
    """Names of the minitf modules and sub-packages a file imports (relative or absolute); package
    is the file's sub-package under minitf (("explore",) for minitf/web/explore/api.py), () for minitf/x.py.
    A spanning package's module is named with it ("conversations.cache")."""
    out = set()
    for parts, names in _imported(path, package):
        if parts and parts[0] in SPANNING:
            out |= {".".join(parts[:2])} if len(parts) > 1 else {f"{parts[0]}.{n}" for n in names}
        else:
            out |= {parts[0]} if parts else set(names)
    return out


def _imported(path, package: tuple[str, ...]):
    """(module path under minitf as parts, the names imported from it) for each import of minitf."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative to the file's package: level 1 is its own, 2 the one above
                parts = [*package[: len(package) - node.level + 1], *filter(None, mod.split("."))]
            elif mod.startswith("minitf."):
                parts = mod.split(".")[1:]
            elif mod == "minitf":
                parts = []
            else:
                continue
            yield parts, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("minitf."):
                    yield a.name.split(".")[1:], []


def layer_name(path) -> str:
    """minitf/model.py -> "model"; a sub-package's module, minitf/web/explore/api.py -> "web";
    a module of a spanning package, minitf/conversations/cache.py -> "conversations.cache"."""
    parts = path.relative_to(PKG).parts
    if parts[0] in SPANNING:
        return f"{parts[0]}.{parts[1].removesuffix('.py')}"
    return parts[0].removesuffix(".py")


MODULES = sorted(
    p for p in PKG.rglob("*.py") if p != PKG / "__init__.py" and p not in [PKG / n / "__init__.py" for n in SPANNING]
)


# the modules that read a run and never write one: what they read is run_dir.py's, so none needs training/
READERS = sorted(
    p
    for p in MODULES
    if p.relative_to(PKG).parts[0] in ("web", "export", "interpret", "evaluate.py", "generate.py", "cli")
    and p != PKG / "cli" / "train.py"
)


def test_every_module_has_a_layer():
    assert {layer_name(p) for p in MODULES} == set(LEVEL)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_down(path):
    name = layer_name(path)
    package = path.relative_to(PKG).parent.parts
    up = {m for m in minitf_imports(path, package) if LEVEL.get(m, -1) > LEVEL[name]}
    assert not up, f"{path.relative_to(PKG)} (layer {LEVEL[name]}) imports from a higher layer: {sorted(up)}"


@pytest.mark.parametrize("path", READERS, ids=lambda p: str(p.relative_to(PKG)))
def test_reading_a_run_needs_nothing_from_training(path):
    used = minitf_imports(path, path.relative_to(PKG).parent.parts)
    assert "training" not in used, f"{path.relative_to(PKG)} reads runs but imports from minitf.training"


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "model.py"
    bad.write_text("from .trainer import train\nimport minitf.web.figures\nfrom .training import checkpoint\n")
    assert minitf_imports(bad) == {"trainer", "web", "training"}


def test_the_checker_reads_a_sub_package(tmp_path):
    mod = tmp_path / "api.py"
    mod.write_text(
        "from .server import x\nfrom . import static\nfrom ...trainer import train\nfrom minitf.cli.common import y\n"
    )
    assert minitf_imports(mod, ("web", "explore")) == {"web", "trainer", "cli"}
    assert layer_name(PKG / "web" / "explore" / "api.py") == "web" and layer_name(PKG / "model.py") == "model"


def test_the_checker_follows_relative_imports_up(tmp_path):
    cmd = tmp_path / "train.py"
    cmd.write_text("from . import common\nfrom ..trainer import train\nfrom .. import web\nimport minitf.export.hf\n")
    assert minitf_imports(cmd, ("cli",)) == {"cli", "trainer", "web", "export"}
    low = tmp_path / "config.py"
    low.write_text("from .cli.train import main\n")
    assert minitf_imports(low) == {"cli"}  # so config.py importing a command is caught


def test_helpers_below_the_trainer_are_never_handed_a_function_to_call_back():
    """Helpers are called and never call back: no function of training/ or budget.py takes a callable
    but a log line's sink, and the set-up is handed none of the trainer's own (its step, the HF loader,
    the export words)."""
    import importlib
    import inspect

    modules = ["minitf.budget", *(f"minitf.training.{p.stem}" for p in (PKG / "training").glob("[a-z]*.py"))]
    handed = []
    for name in modules:
        module = importlib.import_module(name)
        for fn_name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ != name:
                continue
            for param in inspect.signature(fn).parameters.values():
                if "Callable" in str(param.annotation) and param.name not in ("log", "write"):
                    handed.append(f"{name}.{fn_name}({param.name})")
    assert handed == []
    from minitf.training import setup

    params = {p for _, fn in inspect.getmembers(setup, inspect.isfunction) for p in inspect.signature(fn).parameters}
    assert not params & {"step", "load_pretrained", "export_words"}


def _module_of(parts: list[str], name: str | None) -> str | None:
    """The file an import reaches, as a dotted name under minitf: parts is the module imported from,
    name one name imported (a sub-module of a package is its own file)."""
    base = PKG.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return ".".join(parts)
    if name and (base / f"{name}.py").is_file():
        return ".".join([*parts, name])
    return ".".join([*parts, "__init__"]) if (base / "__init__.py").is_file() else None


def import_graph() -> dict[str, set[str]]:
    """Each module (dotted, under minitf) -> the modules it imports, at the top or inside a function."""
    graph = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        name = ".".join(rel.with_suffix("").parts)
        targets = set()
        for parts, names in _imported(path, rel.parent.parts):
            targets |= {_module_of(parts, n) for n in names or [None]}
        graph[name] = targets - {None, name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of graph, each as a path that returns to its start (depth-first search)."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_no_file_imports_itself_through_others():
    """No circle of imports between files (a function-level import counts: it hides the circle, not
    breaks it). The package's own __init__ is left out: it gathers the public names from below."""
    graph = {m: t - {"__init__"} for m, t in import_graph().items() if m != "__init__"}
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_corpus_imports_nothing_above_it():
    """corpus/ writes the token cache whose format data.py owns: it imports the layers below it, and
    never a conversation's, a run's or a model's modules."""
    for path in (PKG / "corpus").glob("*.py"):
        up = {m for m in minitf_imports(path, ("corpus",)) if LEVEL.get(m, -1) > LEVEL["corpus"]}
        assert not up, f"corpus/{path.name} imports from above corpus/: {sorted(up)}"
