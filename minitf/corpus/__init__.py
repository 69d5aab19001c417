"""Where text comes from, and how it is tokenized once into the token cache.

Where a corpus comes from (`sources`: files, Hugging Face datasets, the default Shakespeare in
`shakespeare`, and corpora generated once into the cache by `generated`: `repeats` and the
conversations of `chat_corpus`), which documents are held out (`split`), and how a corpus is
tokenized once (`prepare`, `token_cache`) into the token cache that data.py reads."""
