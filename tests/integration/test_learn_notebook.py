"""The walk-through docs/learn/attention.py, run as a notebook: jupytext turns it into an .ipynb and
nbclient executes that in a python3 kernel, as a reader's Jupyter would. Its asserts (the tutorials'
numbers, equality with minitf.attention, minitf.inspect and the KV cache, the no-mask model's
losses) make it fail when the library or the text drifts; any error in a cell fails the test."""

import os

import pytest

from tests.helpers import ROOT

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
    # a short training budget on the local text, so no network is needed; the kernel inherits the
    # environment (PYTHONPATH, the private MINITF_CACHE) and runs in tmp_path, where runs/ goes
    monkeypatch.setenv("MINITF_LEARN_SECONDS", "15")
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
    assert "with the cache == recomputing everything" in outputs
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
