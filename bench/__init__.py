"""What `minitf bench` measures on this machine, and the command itself (`minitf bench --help`)."""
