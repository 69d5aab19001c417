"""Text in: where a corpus comes from (`sources`: files, Hugging Face datasets, the default
Shakespeare in `shakespeare`) and how it is tokenized once into the token cache (`token_cache`)."""
