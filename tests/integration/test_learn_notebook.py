"""The walk-through docs/learn/attention.py, run as a notebook: jupytext turns it into an .ipynb and
nbclient executes that in a python3 kernel, as a reader's Jupyter would. Its asserts (the tutorials'
numbers, equality with minitf.attention, minitf.inspect and the KV cache, the no-mask model's
losses) make it fail when the library or the text drifts; any error in a cell fails the test."""

import math
import os
import re

import pytest

from tests.support import ROOT

WALK_THROUGH = ROOT / "docs" / "learn" / "attention.py"


MISSING = "the walk-through's notebook tools are not installed (pip install -e '.[learn]')"


jupytext = pytest.importorskip("jupytext", reason=MISSING)


nbclient = pytest.importorskip("nbclient", reason=MISSING)


pytest.importorskip("ipykernel", reason=MISSING)


def notebook():
    nb = jupytext.read(WALK_THROUGH)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    return nb


@pytest.mark.slow
@pytest.mark.timeout(600)  # about a minute on 2 idle cores; far more while other jobs share them
def test_walk_through_runs_as_a_notebook(tmp_path, monkeypatch):
    # a short training budget on the local text, so no network is needed (5 s: what is checked here
    # holds for any number of steps, and the note for a budget that bought too few is the test
    # below's); the kernel inherits the environment (PYTHONPATH, the private MINITF_CACHE) and runs
    # in tmp_path, where runs/ goes
    monkeypatch.setenv("MINITF_LEARN_SECONDS", "5")
    monkeypatch.setenv("MINITF_LEARN_CORPUS", "local")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = notebook()
    nbclient.NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(
        o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
    )
    assert "['The', ' cat', ' sat', ' on', ' the', ' mat']" in outputs
    assert "minitf.generate with the cache == recomputing everything: True; both wrote " in outputs
    assert "20 tokens predicted from the cache and from the whole text: the logits differ by at most " in outputs
    figures = [o for cell in nb.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(figures) == 5  # positions, the loss curve, four heads, mask vs no mask, an induction head forming
    assert len(list((tmp_path / "runs").glob("learn-2*/tokenizer.json"))) == 1  # the run it trained


def test_a_wrong_number_fails_the_notebook(tmp_path):
    """The asserts bite: the first chapter with one expected token changed fails in its cell."""
    nb = notebook()
    cells = [c for c in nb.cells if c.cell_type == "code"][:2]  # imports, then chapter 1
    assert '" mat"]' in cells[1].source
    cells[1].source = cells[1].source.replace('" mat"]', '" mats"]')
    nb.cells = cells
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="AssertionError"):
        client.execute()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_training_budget_that_bought_too_few_steps_says_so(tmp_path, monkeypatch):
    """Chapter 5 with a 1-second budget: its training cell says the steps were too few for words
    and how many seconds to give it, as minitf train's closing note does (the walk-through up to
    that cell only)."""
    monkeypatch.setenv("MINITF_LEARN_SECONDS", "1")
    monkeypatch.setenv("MINITF_LEARN_CORPUS", "local")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = notebook()
    (end,) = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "ENOUGH_STEPS:" in c.source]
    nb.cells = nb.cells[: end + 1]
    nbclient.NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    said = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    steps = int(re.search(r"^trained on local: (\d+) steps in ", said, re.M)[1])
    assert 0 < steps < 500
    more = re.search(
        r"^note: the 1 s budget bought only (\d+) steps on this machine .*under the ~500 this model "
        r"needs before its samples hold words: expect noise below\. For more, run again with "
        r"MINITF_LEARN_SECONDS=(\d+)$",
        said,
        re.M,
    )
    assert more and int(more[1]) == steps and int(more[2]) == math.ceil(500 / steps / 60) * 60
