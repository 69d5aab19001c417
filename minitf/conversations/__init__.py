"""Conversations as data: JSONL messages to batches with a loss mask, and answers back.

The template itself, and the loss mask it draws, are minitf/chat_template.py, on the reading path.
Here: a conversation's rules and the JSONL reader (`rules`), its contents kept as text when they
spell the template's markers (`markers`), the Jinja sandbox a template runs in (`sandbox`) and the
worker process that renders a downloaded one within bounds of time, text and memory (`bounded`),
the template and the special tokens it names read from a run's or a download's directory
(`template_files`),
conversations tokenized once into the chat token cache (`cache`) and read back as batches whose
targets hold IGNORE outside the answers (`data`), a fine-tune's set-up, the template's tokens in
the vocabulary (`sft`), talking to a chat model (`answer`: minitf.chat, minitf.chat_stream,
exact_match), and the metric the chat recipe adds to each evaluation (`metrics`: held-out
questions answered exactly).
"""
