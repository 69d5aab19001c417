"""`python -m minitf <command>`: the same as the `minitf` command."""

from .commands import main

main()
