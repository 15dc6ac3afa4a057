"""Frozen configuration: ModelConfig parsed from a Hugging Face config.json, EngineConfig for runtime knobs.

ModelConfig is read from the checkpoint's own fields, never guessed from a name. Both are frozen and
round-trip through JSON, so a recipe can record and replay them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
}


class ConfigError(ValueError):
    """A config.json that specpilot cannot run; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"
    partial_rotary_factor: float = 1.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope: RopeConfig
    attention_bias: bool = False
    mlp_bias: bool = False
    layer_types: tuple[str, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    # keys the checkpoint may hold that this architecture deliberately does not load (vision tower, MTP head)
    ignored_key_prefixes: tuple[str, ...] = field(default=())

    @property
    def is_hybrid(self) -> bool:
        return "linear_attention" in self.layer_types

    @property
    def num_attention_layers(self) -> int:
        return sum(t == "full_attention" for t in self.layer_types)

    @property
    def num_linear_layers(self) -> int:
        return sum(t == "linear_attention" for t in self.layer_types)

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no config.json; a model directory needs the Hugging Face config.json") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ConfigError(
                f"{source}: architectures={archs!r} is not supported; specpilot runs "
                f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        text = raw.get("text_config", raw) if arch == "Qwen3_5ForConditionalGeneration" else raw
        if not isinstance(text, dict):
            raise ConfigError(f"{source}: text_config must be an object")
        return _parse(arch, family, raw, text, source)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _need(d: dict, key: str, source: str):
    if key not in d:
        raise ConfigError(f"{source}: missing required field {key!r}")
    return d[key]


def _parse_rope(text: dict, family: str) -> RopeConfig:
    params = dict(text.get("rope_parameters") or {})
    scaling = dict(text.get("rope_scaling") or {})
    params = {**scaling, **params}
    theta = params.get("rope_theta", text.get("rope_theta", 10000.0))
    default_partial = 0.25 if family == "qwen3_5" else 1.0
    partial = params.get("partial_rotary_factor", text.get("partial_rotary_factor", default_partial))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise ConfigError(f"rope type {rope_type!r} is not supported (supported: default, llama3)")
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        partial_rotary_factor=float(partial),
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )


def _eos_ids(raw: dict, text: dict) -> tuple[int, ...]:
    eos = text.get("eos_token_id", raw.get("eos_token_id"))
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _layer_types(text: dict, family: str, num_layers: int) -> tuple[str, ...]:
    if family != "qwen3_5":
        return ("full_attention",) * num_layers
    types = text.get("layer_types")
    if types is None:
        interval = int(text.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    if len(types) != num_layers or set(types) - {"full_attention", "linear_attention"}:
        raise ConfigError(f"layer_types must list {num_layers} of 'full_attention'/'linear_attention', got {types}")
    return tuple(types)


def _parse(arch: str, family: str, raw: dict, text: dict, source: str) -> ModelConfig:
    hidden = int(_need(text, "hidden_size", source))
    heads = int(_need(text, "num_attention_heads", source))
    layers = int(_need(text, "num_hidden_layers", source))
    tie = text.get("tie_word_embeddings", raw.get("tie_word_embeddings", False))
    linear = {}
    ignored: tuple[str, ...] = ()
    if family == "qwen3_5":
        linear = dict(
            linear_num_key_heads=int(_need(text, "linear_num_key_heads", source)),
            linear_num_value_heads=int(_need(text, "linear_num_value_heads", source)),
            linear_key_head_dim=int(_need(text, "linear_key_head_dim", source)),
            linear_value_head_dim=int(_need(text, "linear_value_head_dim", source)),
            linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
        )
        if linear["linear_num_value_heads"] % linear["linear_num_key_heads"]:
            raise ConfigError(f"{source}: linear_num_value_heads must be a multiple of linear_num_key_heads")
        ignored = ("mtp.", "model.visual.")
    kv_heads = int(text.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise ConfigError(f"{source}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    return ModelConfig(
        architecture=arch,
        family=family,
        vocab_size=int(_need(text, "vocab_size", source)),
        hidden_size=hidden,
        intermediate_size=int(_need(text, "intermediate_size", source)),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=int(text.get("head_dim") or hidden // heads),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(text.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(tie),
        rope=_parse_rope(text, family),
        attention_bias=bool(text.get("attention_bias", False)),
        mlp_bias=bool(text.get("mlp_bias", False)),
        layer_types=_layer_types(text, family, layers),
        eos_token_ids=_eos_ids(raw, text),
        bos_token_id=text.get("bos_token_id", raw.get("bos_token_id")),
        pad_token_id=text.get("pad_token_id", raw.get("pad_token_id")),
        ignored_key_prefixes=ignored,
        **linear,
    )


@dataclass(frozen=True, slots=True)
class Ablations:
    """Switches that each turn one GPU fast path off (all on by default): for A/B measurements and debugging.
    Each is read once, by specpilot/runtime/settings.py::Runtime.build; none has an effect on the CPU. Why each
    default: docs/decisions/2026-12-01-engine-config-defaults.md."""

    compile_pointwise: bool = True  # decode steps, captured verify graphs and DFlash proposal graphs: torch.compile
    # the pointwise helpers (layers/pointwise.py)
    decode_gemv: bool = True  # decode steps, verify blocks, DFlash proposals: projections of up to ops.gemv.MAX_M
    # rows through ops/gemv instead of cuBLAS
    fused_qk_rope_store: bool = True  # decode steps and tree-op verify blocks: q/k norm + RoPE + K/V store in one
    # kernel (ops/qk_norm_rope_store)
    decode_pdl: bool = True  # decode steps: our kernels launch with programmatic dependent launch (ops/pdl.py)
    decode_gated_down: bool = True  # single-row decode steps: the down GEMV forms silu(gate) * up itself
    w12n_swiglu: bool = True  # W12N: an MLP's gate_up GEMV (up to 16 rows) forms silu(gate) * up in its epilogue
    triton_gdn_prefill: bool = True  # hybrid prefill on CUDA: fla-core's chunked delta rule where installed, else ours
    # as one Triton kernel per layer


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Runtime knobs, turned into a Runtime (specpilot/runtime/settings.py) once per run. Round-trips through JSON
    (to_dict / from_dict). Why each default: docs/decisions/2026-12-01-engine-config-defaults.md."""

    cuda_graphs: bool = True  # decode steps and DFlash proposals replayed from CUDA graphs (GPU only)
    # "bf16"; "w12n": products of up to 16 rows read the W12N planes, the bf16 weights kept for the rest; "w12n_only":
    # the bf16 copies dropped, every product through the planes (larger ones decode W and call cuBLAS). Both need a
    # bf16 model.
    weight_format: str = "bf16"
    # multi-token blocks (prefill, verify): "tree" (the tree-attention op), "sdpa", or "auto" (tree on GPU, SDPA on CPU)
    block_attention: str = "auto"
    # capture the verify forward per (batch, tree width, chain or tree) (GPU, with the tree-attention op only: the
    # SDPA path slices the prefix by a host-side length, which a captured graph cannot follow)
    verify_graphs: bool = True
    # N > 0: a verify graph is a chain of graphs cut after layer 0 and every N layers, so that launching it overlaps
    # the GPU's work on the first layers; 0: one graph
    verify_layers_per_graph: int = 8
    # hybrid targets, chains: "fold" verifies a chain as a tree and folds the kept prefix into the state (no second
    # pass); "replay" runs the plain recurrence, then restores a snapshot and re-runs the kept prefix on a miss
    hybrid_chain_commit: str = "fold"
    decode_attention_splits: int = 0  # decode attention chunks per sequence (0: from the shapes; 1: no combine pass)
    ablations: Ablations = field(default_factory=Ablations)

    def __post_init__(self):
        if self.weight_format not in ("bf16", "w12n", "w12n_only"):
            raise ValueError(f"EngineConfig.weight_format={self.weight_format!r}: use 'bf16', 'w12n' or 'w12n_only'")
        if self.block_attention not in ("auto", "sdpa", "tree"):
            raise ValueError(f"EngineConfig.block_attention={self.block_attention!r}: use 'auto', 'sdpa' or 'tree'")
        if self.hybrid_chain_commit not in ("fold", "replay"):
            raise ValueError(f"EngineConfig.hybrid_chain_commit={self.hybrid_chain_commit!r}: use 'fold' or 'replay'")
        if self.verify_layers_per_graph < 0:
            raise ValueError(f"EngineConfig.verify_layers_per_graph={self.verify_layers_per_graph}: must be >= 0")
        if self.decode_attention_splits < 0:
            raise ValueError(f"EngineConfig.decode_attention_splits={self.decode_attention_splits}: must be >= 0")
        if not isinstance(self.ablations, Ablations):
            raise ValueError(f"EngineConfig.ablations={self.ablations!r}: must be an Ablations")

    def to_dict(self) -> dict:
        """Plain JSON types; the ablations as a nested object."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> EngineConfig:
        """The inverse of to_dict. An ablation switch may also be named at top level (a bench configuration's
        `decode_gemv:false`); a key that is neither an EngineConfig nor an Ablations field is a ValueError."""
        top = {f.name for f in dataclasses.fields(cls)}
        switches = {f.name for f in dataclasses.fields(Ablations)}
        nested = raw.get("ablations", {})
        if not isinstance(nested, dict):
            raise ValueError(f"EngineConfig ablations={nested!r}: must be an object of {', '.join(sorted(switches))}")
        for key in raw:
            if key not in top | switches:
                raise ValueError(f"EngineConfig: unknown key {key!r}; fields: {', '.join(sorted(top - {'ablations'}))}"
                                 f"; ablation switches: {', '.join(sorted(switches))}")
        for key in nested:
            if key not in switches:
                raise ValueError(f"EngineConfig ablations: unknown key {key!r}; switches: "
                                 f"{', '.join(sorted(switches))}")
        flat = {k: v for k, v in raw.items() if k in switches}
        if set(flat) & set(nested):
            raise ValueError(f"EngineConfig: {sorted(set(flat) & set(nested))} given both at top level and under "
                             "ablations; give each once")
        fields = {k: v for k, v in raw.items() if k in top and k != "ablations"}
        return cls(**fields, ablations=Ablations(**nested, **flat))

    def replace(self, **fields) -> EngineConfig:
        """A copy with `fields` changed; an ablation switch is named like a field (decode_gemv=False)."""
        switches = {f.name for f in dataclasses.fields(Ablations)}
        ablations = dataclasses.replace(self.ablations, **{k: v for k, v in fields.items() if k in switches})
        return dataclasses.replace(self, **{k: v for k, v in fields.items() if k not in switches}, ablations=ablations)

    @staticmethod
    def field_names() -> tuple[str, ...]:
        """Every key from_dict takes at top level: the EngineConfig fields and the ablation switches."""
        return (tuple(f.name for f in dataclasses.fields(EngineConfig) if f.name != "ablations")
                + tuple(f.name for f in dataclasses.fields(Ablations)))
