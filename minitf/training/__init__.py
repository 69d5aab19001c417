"""A run's machinery: set-up, session, checkpoints and lock, FSDP, LoRA, logs, snapshots.

Around the loop in `minitf/trainer.py`: its set-up before the first step (`setup`, with the run's
name and prompt from `naming`, and what each data.format asks from `data_format`), the run in
progress (`session`), its directory, checkpoints and lock (`checkpoint`), sharded training
(`fsdp`), LoRA through peft (`lora`), weights held in 16 bits (`precision`), the weights kept
along the way (`snapshots`), what it shows while it trains (`report`) and the metrics logs
(`metrics`)."""
