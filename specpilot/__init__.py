"""specpilot: lossless speculative decoding for Hugging Face LLMs (PyTorch + Triton)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("specpilot")  # pyproject.toml's, through the installed metadata: the one source
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "unknown"
