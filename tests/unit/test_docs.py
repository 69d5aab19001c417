"""The README and docs/ stay true to the tree: every relative link and picture points at a file in
the repository (and a #anchor at a heading of it), docs/design.md lists the layers
tests/unit/test_layers.py enforces, the pages speak to users only, and every command of the README's
quick start is one that CI (.ci/run) runs."""

import re
import shlex
from pathlib import Path

import pytest

from tests import tree
from tests.support import ROOT
from tests.support.docs import PAGES, shell_commands
from tests.unit.test_layers import LAYERS

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)


LINK = re.compile(r"!?\[(?:[^\]`]|`[^`]*`)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where links are links."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces become hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors on its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, with GitHub's -1, -2 ... for repeated ones."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m[1])
            out.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return out


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text(encoding="utf-8")))


def test_the_link_checker_sees_links_and_anchors(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "# A title\n## Use it: `x` & y\n## Use it: `x` & y\n"
        'See [a](docs/a.md#b-c), ![pic](img/x.png "t") and [web](https://x.org).\n'
        "```\n[not a link](nowhere.md)\n# not a heading\n```\n`[nor this](nowhere.md)`\n",
        encoding="utf-8",
    )
    assert links(page) == ["docs/a.md#b-c", "img/x.png", "https://x.org"]
    assert anchors(page) == {"a-title", "use-it-x--y", "use-it-x--y-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_and_headings_that_exist(page):
    assert links(page) or page.name != "README.md", "the README links to nothing: is the link pattern broken?"
    broken = []
    for link in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto: ...: not a file of the repository
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.is_relative_to(ROOT) or not target.exists():
            broken.append(f"{link}: no file {target} in the repository")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: no heading #{anchor} in {target.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_design_lists_the_layers_that_test_layers_enforces():
    """tests/unit/test_layers.py points readers at docs/design.md, "Layers": its table must be LAYERS."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    assert "layers" in anchors(ROOT / "docs" / "design.md")
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\|\s*(\d+)\s*\|([^|]*)\|", section, re.M)
    assert [int(n) for n, _ in rows] == list(range(len(rows)))
    assert [set(re.findall(r"`([\w.]+)`", cell)) for _, cell in rows] == LAYERS


# The pages speak to users: what minitf does and how fast, never how the work on it was organised.
NOT_FOR_USERS = [
    "this vm",
    "the issue",
    "issue's",
    "other engineers",
    "targets set",
    "target set",
    "this project's machines",
    "session with a gpu",
    "/work/",
    "../" + "shared",  # written in two pieces, so this file does not name it itself
]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_speak_to_users(page):
    text = page.read_text(encoding="utf-8").lower()
    assert not [w for w in NOT_FOR_USERS if w in text]


def quick_start() -> list[list[str]]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return [
        words
        for block in re.findall(r"^```(?:bash|sh)\n(.*?)^```", section, re.M | re.S)
        for words in shell_commands(block)
    ]


def split_and(words: list[str]) -> list[list[str]]:
    parts = [[]]
    for w in words:
        parts.append([]) if w == "&&" else parts[-1].append(w)
    return parts


def editable_extras(words: list[str]) -> set[str] | None:
    """The extras of `[python -m] pip install [options] -e .[a,b]`, or None for another command."""
    words = words[2:] if words[:3] == ["python", "-m", "pip"] else words
    if words[:2] != ["pip", "install"] or "-e" not in words:
        return None
    m = re.fullmatch(r"\.(?:\[([\w,-]*)\])?", words[words.index("-e") + 1])
    return set(filter(None, (m[1] or "").split(","))) if m else None


def run_by_ci(command: list[str], ci: list[list[str]]) -> bool:
    """True if CI runs this command as it is, or runs what follows its leading `pip install -e .[x]`
    as it is, having installed at least those extras before (CI uses `python -m pip` and more extras)."""
    if command in ci:
        return True
    parts = split_and(command)
    while parts and editable_extras(parts[0]) is not None:
        wanted = editable_extras(parts.pop(0))
        installs = [i for i, c in enumerate(ci) if (editable_extras(c) or set()) >= wanted]
        if not installs:
            return False
        ci = ci[installs[0] + 1 :]  # what follows must run after that install
    rest = [w for part in parts for w in (*part, "&&")][:-1]
    return bool(rest) and rest in ci


def test_the_quick_start_matcher_can_say_no():
    ci = shell_commands(
        "python -m pip install --quiet -e '.[test,hf]'  # comment\nif true; then\n    python -m pytest\nfi\n"
        "pip install -e . && python scripts/train.py && \\\n    python scripts/generate.py\n"
    )
    assert run_by_ci(shlex.split("pip install -e '.[test]' && python -m pytest"), ci)
    assert run_by_ci(shlex.split("pip install -e . && python scripts/train.py && python scripts/generate.py"), ci)
    assert not run_by_ci(shlex.split("pip install -e '.[test,gpu]' && python -m pytest"), ci)  # gpu: not installed
    assert not run_by_ci(shlex.split("pip install -e '.[test]' && python -m pytest -x"), ci)
    assert not run_by_ci(shlex.split("python scripts/train.py --config configs/tiny.yaml"), ci)
    assert not run_by_ci(shlex.split("pip install -e ."), ci)  # an install alone runs nothing


def test_every_quick_start_command_is_run_by_ci():
    commands = quick_start()
    assert any("pytest" in c for c in commands) and any("scripts/train.py" in c for c in commands)
    ci = shell_commands((ROOT / ".ci" / "run").read_text(encoding="utf-8"))
    missing = [" ".join(c) for c in commands if not run_by_ci(c, ci)]
    assert not missing, f"README quick-start commands that .ci/run does not run: {missing}"


def test_the_learn_extra_installs_what_the_walk_through_tells_the_reader_to_run():
    """docs/learn/README.md's programs come with `pip install -e '.[learn]'`, and its `jupyter
    execute` keeps the outputs (without --inplace it runs the notebook and shows nothing)."""
    extra = re.search(r"^learn = \[(.*)\]", (ROOT / "pyproject.toml").read_text(), re.M)[1]
    packages = {re.match(r'"([\w-]+)', p.strip())[1] for p in extra.split(",")}
    provides = {"jupytext": "jupytext", "jupyter lab": "jupyterlab", "jupyter execute": "nbclient"}
    text = (ROOT / "docs" / "learn" / "README.md").read_text(encoding="utf-8")
    commands = [" ".join(w) for w in shell_commands("\n".join(FENCE.findall(text)).replace("```", "#"))]
    commands += re.findall(r"`(jupyter execute[^`]*)`", text)
    used = {program for c in commands for program in provides if c.startswith(program)}
    assert used >= {"jupytext", "jupyter lab", "jupyter execute"}
    assert {provides[p] for p in used} <= packages
    assert all("--inplace" in c for c in commands if c.startswith("jupyter execute"))


def test_the_reading_path_says_each_files_length():
    """README's "Read the code": each file's length as it is, and their total."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## Read the code\n", 1)[1].split("\n## ")[0]
    listed = re.findall(r"\[`(minitf/\w+\.py)`\]\(minitf/\w+\.py\) \((\d+) lines\)", section)
    lengths = {f: len((ROOT / f).read_text(encoding="utf-8").splitlines()) for f, _ in listed}
    assert len(listed) >= 7 and {f: int(n) for f, n in listed} == lengths
    total = re.search(r"are ([\d,]+) lines in (\d+) files", section)
    assert (int(total[1].replace(",", "")), int(total[2])) == (sum(lengths.values()), len(listed))
    # the textbook holds the batches the loop starts from and the chat template, and stays an afternoon's read
    # (with the options the downloaded families need, each in its place beside the path it leaves alone)
    assert {"minitf/data.py", "minitf/chat_template.py"} <= lengths.keys() and sum(lengths.values()) <= 2400


@pytest.mark.parametrize("page", tree.PAGES, ids=lambda p: p.name)
def test_the_pages_tree_is_the_packages(page):
    """The README's and docs/design.md's tree of minitf/ is generated from the code (tests/tree.py)."""
    assert tree.written(page) == tree.block(), f"{page.name}'s tree has drifted: run python -m tests.tree --write"


def test_the_top_of_the_package_is_the_textbook_and_few_more():
    """At most 20 modules at the top of minitf/: the reading path and what every layer needs."""
    top = tree.top_modules()
    assert set(tree.READING_PATH) <= set(top) and len(top) <= 20, top


@pytest.mark.parametrize("package", tree.packages())
def test_each_package_docstring_names_what_it_holds(package):
    """A sub-package's docstring names each of its modules (as `name` or name.py)."""
    doc = (tree.PKG / package / "__init__.py").read_text(encoding="utf-8")
    doc = doc.split('"""')[1]
    held = {p.stem for p in (tree.PKG / package).glob("*.py") if not p.stem.startswith("__")}
    held |= {p.parent.name for p in (tree.PKG / package).glob("*/__init__.py")}
    named = set(re.findall(r"`(\w+)`", doc)) | set(re.findall(r"\b(\w+)\.py\b", doc))
    assert held <= named, f"minitf/{package}/__init__.py does not name {sorted(held - named)}"


def test_the_tree_is_written_between_its_markers(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(f"before\n{tree.OPEN}\nold\n{tree.CLOSE}\nafter\n")
    assert tree.written(page) == f"{tree.OPEN}\nold\n{tree.CLOSE}"
    assert tree.summary(tree.PKG / "model.py").startswith("The Transformer")
