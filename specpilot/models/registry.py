"""Maps a config's family (from its HF `architectures` entry, see config.py) to the module that builds it."""

from types import ModuleType

from specpilot.models import llama, qwen3, qwen3_5

FAMILIES: dict[str, ModuleType] = {"llama": llama, "qwen3": qwen3, "qwen3_5": qwen3_5}
