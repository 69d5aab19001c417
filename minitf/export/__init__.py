"""A minitf model in other tools and back: which standard architecture computes it
(`architecture`), the Hugging Face directory both ways (`hf`) and the GGUF file for llama.cpp
(`gguf`)."""
