"""minitf.plots.interpret_figures: the head-score and patching figures are drawn, with the colours of their numbers."""

import matplotlib.image as mpimg
import numpy as np
import pytest

import minitf
from minitf.interpret import attribute, head_scores, patch_heads, patch_residual, repeated_tokens
from minitf.plots.interpret_figures import plot_attribution, plot_head_patching, plot_head_scores, plot_patching
from tests.interpret_models import induction_model
from tests.support.models import CLEAN, CORRUPTED, E, F


def share_of(img: np.ndarray, rgb, tol: float = 0.03) -> float:
    """The share of the image's pixels within tol of the colour rgb (0..1 floats)."""
    return float((np.abs(img[..., :3] - np.array(rgb)) < tol).all(-1).mean())


def test_head_scores_figure_has_a_panel_per_score(tmp_path):
    scores = head_scores(induction_model(), repeated_tokens(16, 6))
    out = plot_head_scores(scores, tmp_path / "scores.png", title="hand-built heads")
    img = mpimg.imread(out)  # (height, width, 4)
    assert img.shape[1] > 2.5 * img.shape[0]  # three panels side by side
    assert share_of(img, (0.80, 0.88, 0.11), tol=0.08) > 0.02  # the previous-token head's near-1 cell: yellow
    assert img[..., :3].std() > 0.1


def test_patching_figures_show_recovery_in_blue(tmp_path):
    model = induction_model()
    recovered = patch_residual(model, CLEAN, CORRUPTED, answer=E, wrong=F)
    img = mpimg.imread(plot_patching(recovered, [str(int(i)) for i in CLEAN], tmp_path / "patch.png"))
    dark_blue = share_of(img, (0.02, 0.19, 0.38), tol=0.04)  # RdBu at 1: the three cells that recover
    assert dark_blue > 0.02
    red = share_of(img, (0.40, 0.0, 0.12), tol=0.04)  # RdBu at -1: only the colour bar's end, no cell
    assert red < dark_blue / 50
    img = mpimg.imread(plot_head_patching(patch_heads(model, CLEAN, CORRUPTED, E, F), tmp_path / "heads.png"))
    assert share_of(img, (0.02, 0.19, 0.38), tol=0.04) > 0.02
    with pytest.raises(minitf.MinitfError, match="3 token labels for 10 positions"):
        plot_patching(recovered, ["a", "b", "c"], tmp_path / "bad.png")
    with pytest.raises(minitf.MinitfError, match="no scores"):
        plot_head_scores({}, tmp_path / "none.png")
    assert not (tmp_path / "bad.png").exists()


def test_attribution_figure_shows_the_induction_heads_share_in_red(tmp_path):
    ids = repeated_tokens(16, 7, batch=1)[0]  # (14,)
    a = attribute(induction_model(), ids[:-1], int(ids[-1]))  # the induction head writes nearly all of it
    img = mpimg.imread(plot_attribution(a, tmp_path / "attribution.png", token_label_text="next"))
    assert img.shape[1] > 2 * img.shape[0]  # the grid and the bars side by side
    assert share_of(img, (0.40, 0.0, 0.12), tol=0.05) > 0.01  # RdBu_r at its top: the one head's cell
