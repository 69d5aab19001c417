"""Figures drawn to files: loss curves, attention heatmaps, heads over training, interpret's grids.

Drawn with matplotlib (imported on use, never through pyplot): a run's loss curves and attention
heatmaps (`figures`), a run's heads over its snapshots (`training_figures`), and minitf.interpret's
numbers as grids and bars (`interpret_figures`). Nothing here serves or computes: the numbers come
from a run directory, minitf.inspection and minitf.interpret."""
