"""Model ops: each has a plain PyTorch reference (`*_reference`) and a faster path tested against it."""
