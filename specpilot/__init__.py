"""specpilot: lossless speculative decoding for Hugging Face LLMs (PyTorch + Triton)."""

__version__ = "0.1.0"
