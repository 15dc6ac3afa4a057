"""What `specpilot demo` runs: the bundled trained zoo (zoo/ in the repository, or $SPECPILOT_ZOO), a target and
one of its drafters (a drafter directory of the zoo, or the MTP layer the hybrid target's checkpoint carries).
Without a zoo (an install that did not keep the repository) it falls back to a tiny Qwen3.5-style hybrid with
RANDOM weights, written once (seeded, a few seconds on CPU) to ~/.cache/specpilot through transformers' own
classes and said plainly to be noise.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

DEMO_VERSION = "1"
ZOO_ENV = "SPECPILOT_ZOO"


def zoo_dir() -> Path | None:
    """The zoo directory, or None when this install has none."""
    root = Path(os.environ.get(ZOO_ENV) or Path(__file__).resolve().parents[1] / "zoo")
    return root if (root / "zoo.json").exists() else None


def zoo_pair(target: str, drafter: str) -> tuple[Path, str]:
    """(target directory, drafter name for build_drafter) of the zoo; `ngram` and `none` pass through, `mtp` is the
    target's own MTP layer."""
    root = zoo_dir()
    if root is None:
        raise FileNotFoundError(f"no trained zoo found (looked in ${ZOO_ENV} and the repository's zoo/); "
                                "rebuild it with `specpilot train zoo --out zoo`")
    if drafter in ("ngram", "none"):
        return root / target, drafter
    have = zoo_drafters(root, target)
    if drafter in have:
        name = drafter if drafter == "draft-lm" else f"{target}-{drafter}"  # one draft LM serves both targets
        return root / target, "mtp" if drafter == "mtp" else str(root / name)
    raise FileNotFoundError(f"the zoo ({root}) has no {drafter} drafter for the {target} target; its drafters for "
                            f"{target}: {', '.join(have)}")


def zoo_drafters(root: Path, target: str) -> list[str]:
    """The demo's --drafter names the zoo holds for `target`: its own drafters (`TARGET-KIND/`), the shared draft LM,
    the MTP layer in the target's checkpoint, and ngram (no weights)."""
    names = sorted(p.name.removeprefix(f"{target}-") for p in root.glob(f"{target}-*") if (p / "config.json").exists())
    if (root / "draft-lm" / "config.json").exists():
        names.append("draft-lm")
    if _has_mtp_layer(root / target):
        names.append("mtp")
    return names + ["ngram"]


def _has_mtp_layer(model_dir: Path) -> bool:
    try:
        raw = json.loads((model_dir / "config.json").read_text())
    except FileNotFoundError:
        return False
    text = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    return bool(text.get("mtp_num_hidden_layers"))


def demo_dir() -> Path:
    root = Path(os.environ.get("SPECPILOT_CACHE", Path.home() / ".cache" / "specpilot"))
    return root / f"demo-random-v{DEMO_VERSION}"


def demo_config():
    import transformers

    return transformers.Qwen3_5TextConfig(
        vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=32, linear_value_head_dim=32, full_attention_interval=2, max_position_embeddings=2048,
        eos_token_id=0, architectures=["Qwen3_5ForCausalLM"])


def _corpus() -> list[str]:
    # the package's own source: deterministic, always present, code-like
    files = sorted(Path(__file__).parent.rglob("*.py"))
    return [f.read_text() for f in files]


def demo_checkpoint(console=None) -> Path:
    """Path of the demo checkpoint, writing it first if needed (temp dir, then rename: never half-written)."""
    target = demo_dir()
    if (target / "config.json").exists():
        return target
    from specpilot.models.random_checkpoint import write_random_checkpoint

    if console is not None:
        console.print(f"[dim]writing the demo checkpoint to {target} (once)[/]")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-demo-"))
    try:
        write_random_checkpoint(demo_config(), tmp, _corpus(), seed=1234)
        tmp.rename(target)
    except OSError:
        if not (target / "config.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
