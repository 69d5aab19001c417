"""A training run's machinery around the loop in `minitf/trainer.py`: its set-up before the first
step (`setup`, with the run's name and prompt from `naming`), the run in progress (`session`), its
directory, checkpoints and lock (`checkpoint`), sharded training (`fsdp`), the time budget
(`budget`), what it shows while it trains (`report`) and the metrics logs (`metrics`)."""
