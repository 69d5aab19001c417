"""The fast versions of the textbook's math: fused attention and loss, compiled decoding, Muon, AdamW in bfloat16.

To read after the textbook: attention through PyTorch's fused kernels (`fused_attention`, what
model.py runs beside attention.py's formula), the training loss with the LM head fused in so the
full logits are never held (`lm_loss`), the compiled decoding step, CUDA graphs on a GPU
(`decoding`), Muon's orthogonalised updates (`muon`, which optim.py offers beside AdamW), AdamW
for weights held in bfloat16, its updates stochastically rounded (`bf16_adamw`), and a tied
embedding whose gradient is its rows, added into the head's (`tied_embedding`)."""
