"""`python -m minitf <command>`: the same as the `minitf` command."""

from .cli import main

main()
