"""The README's commands run: what they write in a clone is ignored by git, and its llama-cpp-python
line runs an exported file."""

import re
import subprocess
import sys

import pytest

import minitf
from tests.support import ROOT
from tests.support.docs import PAGES, shell_commands

# The README and docs/ stay true to the tree: every relative link and picture points at a file in
# the repository (and a #anchor at a heading of it), docs/design.md lists the layers
# tests/unit/test_layers.py enforces, the pages speak to users only, and every command of the README's
# quick start is one that CI (.ci/run) runs.


def written_by_the_docs() -> set[str]:
    """What the docs' shell commands write inside a clone: their --out targets and outputs with a
    file name (a .gguf, a notebook), plus the runs that training and the walk-through make."""
    out = {"runs/shakespeare", "docs/learn/runs/learn-2026-01-01-120000", "docs/learn/attention.ipynb"}
    out.add("my_tasks/speakers.yaml")  # docs/elsewhere.md's lm-evaluation-harness task
    for page in PAGES:
        for block in re.findall(r"^```(?:bash|sh)\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S):
            for words in shell_commands(block):
                out |= {b for a, b in zip(words, words[1:]) if a == "--out" and not b.startswith(("/", "~", "$"))}
    return out


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_what_the_docs_commands_write_in_a_clone_is_ignored_by_git():
    paths = sorted(written_by_the_docs())
    assert {"hf/shakespeare", "shakespeare.gguf"} <= set(paths)  # the README's exports are among them
    r = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    assert sorted(r.stdout.split()) == paths, f"not ignored: {sorted(set(paths) - set(r.stdout.split()))}"


def test_the_readmes_llama_cpp_python_line_runs_an_exported_file(tiny_run, tmp_path):
    """The README's way to run a GGUF file from Python, with what the llamacpp extra installs."""
    pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[gguf]')")
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install -e '.[llamacpp]')")
    from minitf.export.gguf import export_run

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```(?:bash|sh)\n(.*?)^```", readme, re.M | re.S)
    (line,) = [w for block in blocks for w in shell_commands(block) if "llama_cpp" in " ".join(w)]
    block = minitf.load_config(tiny_run / "config.yaml").model.block_size
    # the default recipe's 256-token context holds 200 new tokens; the test's tiny model holds fewer
    code = line[line.index("-c") + 1].replace("max_tokens=200", f"max_tokens={block // 2}")
    assert f"max_tokens={block // 2}" in code
    export_run(tiny_run, tmp_path / "shakespeare.gguf")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(r.stdout.strip()) > 0  # the continuation llama.cpp sampled
