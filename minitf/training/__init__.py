"""A training run's machinery around the loop in `minitf/trainer.py`: the run in progress
(`session`), its directory, checkpoints and lock (`checkpoint`), sharded training (`fsdp`), the
metrics logs (`metrics`) and the time budget (`budget`)."""
