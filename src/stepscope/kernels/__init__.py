"""Attention kernels: FlashAttention-2 in tiled PyTorch and in Triton, each beside the naive reference."""
