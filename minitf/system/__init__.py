"""Helpers every layer leans on: device, dtype, processes, atomic files, paths, recipes, progress, memory, sizes.

Helpers every layer leans on: device, dtype and processes (`runtime`), files written
atomically (`files`) or one tensor at a time (`streamed_safetensors`), where a run directory
may be (`paths`), the named recipes in configs/
(`recipes`), progress bars and lines (`progress`), this machine's memory (`memory`) and what it
is (`machine`), and a model's sizes checked against that memory (`sizes`)."""
