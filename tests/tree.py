"""The package's tree as the README and docs/design.md show it, generated from the code: each module
at the top of minitf/ and each sub-package with the summary its docstring opens with.

    python -m tests.tree          # print it
    python -m tests.tree --write  # write it into README.md and docs/design.md (tests/unit/test_docs.py checks them)
"""

import ast
import re
import sys

from tests.support import ROOT

PKG = ROOT / "minitf"
# the textbook, in the order the README reads it; then what every layer needs
READING_PATH = [
    "tokenizer",
    "data",
    "positions",
    "attention",
    "model",
    "optim",
    "trainer",
    "sampling",
    "kv_cache",
    "generate",
    "inspection",
    "chat_template",  # the twelfth step: what makes a chat model of the same Transformer
]
PAGES = [ROOT / "README.md", ROOT / "docs" / "design.md"]
OPEN, CLOSE = "<!-- the tree: python -m tests.tree --write -->", "<!-- end of the tree -->"


def summary(path) -> str:
    """A docstring's summary: its first line, a sentence of its own (PEP 257)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return doc.split("\n", 1)[0].rstrip(".")


def top_modules() -> list[str]:
    return sorted(p.stem for p in PKG.glob("*.py") if not p.stem.startswith("__"))


def packages() -> list[str]:
    return sorted(p.parent.name for p in PKG.glob("*/__init__.py"))


def tree() -> str:
    """The tree: the reading path, then the other modules at the top, then the sub-packages."""
    rest = [m for m in top_modules() if m not in READING_PATH]
    rows = [(f"{m}.py", summary(PKG / f"{m}.py")) for m in READING_PATH + rest]
    rows += [(f"{p}/", summary(PKG / p / "__init__.py")) for p in packages()]
    width = max(len(name) for name, _ in rows) + 2
    return "\n".join(["minitf/", *(f"  {name:<{width}}{text}" for name, text in rows)])


def block() -> str:
    return f"{OPEN}\n```\n{tree()}\n```\n{CLOSE}"


def written(page) -> str | None:
    """The tree block a page holds now, or None."""
    m = re.search(re.escape(OPEN) + ".*?" + re.escape(CLOSE), page.read_text(encoding="utf-8"), re.S)
    return m[0] if m else None


def write() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        old = written(page)
        if old is None:
            raise SystemExit(f"{page.relative_to(ROOT)} has no {OPEN} ... {CLOSE} block to write the tree into")
        page.write_text(text.replace(old, block()), encoding="utf-8")


if __name__ == "__main__":
    write() if sys.argv[1:] == ["--write"] else print(tree())
