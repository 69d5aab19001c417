"""The measurements behind `minitf bench` (scripts/bench.py): plain numbers; tests never time."""
