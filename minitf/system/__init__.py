"""Helpers every layer leans on: device, dtype and processes (`runtime`), files written
atomically (`files`), progress bars and lines (`progress`), this machine's memory (`memory`)."""
