"""The `minitf` command and its sub-commands (minitf train, generate, ...); scripts/*.py are thin fronts to them."""
