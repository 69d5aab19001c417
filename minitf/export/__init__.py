"""A minitf model in other tools and back: Hugging Face and GGUF, one weight map.

Which standard architecture computes a model (`architecture`), the weight map that names and lays
out its tensors for each of them (`weights`, with the tensor `layouts`), the Hugging Face directory
both ways (`hf`, reading and writing config.json in `hf_config`, the tensors in `hf_tensors`, a
directory's files in `hf_files`, a hub id as a directory of the hub's cache in `hub`) and the GGUF
file for llama.cpp (`gguf`, its tokenizer as the llama.cpp vocabulary that tokenizes alike in
`gguf_vocab`)."""
