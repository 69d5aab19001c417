"""Helpers every layer leans on: device, dtype, processes, atomic files, progress, memory, sizes.

Helpers every layer leans on: device, dtype and processes (`runtime`), files written
atomically (`files`), progress bars and lines (`progress`), this machine's memory (`memory`) and
what it is (`machine`), and a model's sizes checked against that memory (`sizes`)."""
