"""What several test files share, by concern: runs.py (the tiny recipe, trained runs and their
copies, clocks), corpus.py (generated text), processes.py (scripts, children, gloo workers),
serving.py (a server in a thread), models.py (small hand-made models and sessions), errors.py (one-line
messages, a user's files), docs.py (the pages and their commands), extras.py (the plugin that fails a
skip for a missing extra where every extra is installed), sentencepiece.py (tokenizers as Gemma's and
Mistral's are written).

ROOT is here, with no import beyond pathlib, so `python -m tests.tree` starts without torch."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
