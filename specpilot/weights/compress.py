"""`specpilot compress` and `specpilot inspect`: W12N model directories.

compress: every bf16 matrix of a checkpoint that pays (W12N policy, not the token embedding, which is read by
row) becomes W12N planes; everything else is stored as it was; every tensor gets a CRC-32 of its stored bytes
in the file's metadata (checkpoint/checksum.py). A W12N source is decoded and re-encoded (bit-exact: the same
weights, the current format). Config, tokenizer and generation files are copied, a `w12n.json` manifest records
the format and per-tensor statistics, and the directory is written to a staging path and renamed
(checkpoint/staging.py), so a failed, interrupted or terminated run leaves nothing behind. inspect: the same
statistics, read back from any model directory or Hub id, every checksum checked. Files are read through
checkpoint/ and w12n_file.py; the loader reads W12N directories the same way (models/loader.py).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from specpilot.checkpoint import checksum
from specpilot.checkpoint.directory import resolve_model_dir, safetensors_files
from specpilot.checkpoint.errors import CheckpointError
from specpilot.checkpoint.file import CheckpointFile
from specpilot.checkpoint.staging import publish, staging_dir
from specpilot.weights import w12n
from specpilot.weights.w12n_file import read_source, read_w12n

MANIFEST = "w12n.json"
SHARD_BYTES = 4 << 30
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt", "training.json")
KEEP_BF16 = ("embed_tokens",)  # gathered by row: a GEMV format does not pay there


@dataclass(frozen=True, slots=True)
class TensorReport:
    name: str
    shape: tuple[int, ...]
    fmt: str  # "w12n" | dtype name of a tensor kept as it was
    bits_per_weight: float
    escape_rate: float = 0.0
    verbatim_fraction: float = 0.0


def compress(src: str, dst: str | Path, segment: int | None = None, progress=None) -> list[TensorReport]:
    """Writes the W12N directory `dst` from the model directory or Hub id `src`; returns the per-tensor report.
    segment None lets the encoder pick the escape segment length per tensor (128/256/512)."""
    src_dir, dst = resolve_model_dir(src), Path(dst)
    if dst.exists():
        raise FileExistsError(f"{dst} already exists; choose a new output directory")
    files = safetensors_files(src_dir)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(dst) as tmp:
        reports = _write_tensors(files, tmp, segment, progress)
        for name in COPIED:
            if (src_dir / name).exists():
                shutil.copyfile(src_dir / name, tmp / name)
        manifest = {"format": "w12n", "version": w12n.FORMAT_VERSION, "segment": segment,
                    "tensors": [report_dict(r) for r in reports]}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        publish(tmp, dst)
    return reports


def report_dict(r: TensorReport) -> dict:
    return dataclasses.asdict(r) | {"shape": list(r.shape)}


def _write_tensors(files: list[Path], out: Path, segment: int | None, progress) -> list[TensorReport]:
    total = 0
    for file in files:
        with CheckpointFile(file, unverified_groups=True) as f:  # a format 1 source is rewritten, not loaded
            total += len(f.names)
    task = progress.add_task("compressing", total=total) if progress is not None else None
    reports, shard, sums, shard_bytes, shards = [], {}, {}, 0, []
    for file in files:
        with CheckpointFile(file, unverified_groups=True) as f:
            for name in f.names:
                # W12N planes decoded, re-encoded bit-exact
                planes, report = _convert(name, read_source(f, name), segment)
                reports.append(report)
                shard.update(planes)
                sums[name] = checksum.crc32(list(planes.values()))
                shard_bytes += sum(t.numel() * t.element_size() for t in planes.values())
                if shard_bytes >= SHARD_BYTES:
                    shards.append((shard, sums))
                    shard, sums, shard_bytes = {}, {}, 0
                if task is not None:
                    progress.advance(task)
    shards.append((shard, sums))
    meta = {"format": "pt", "specpilot": "w12n"}
    if len(shards) == 1:
        save_file(shards[0][0], str(out / "model.safetensors"), metadata=meta | checksum.to_metadata(shards[0][1]))
        return reports
    weight_map = {}
    for i, (part, part_sums) in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(part, str(out / name), metadata=meta | checksum.to_metadata(part_sums))
        weight_map.update({k: name for k in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return reports


def _convert(key: str, tensor: torch.Tensor, segment: int | None) -> tuple[dict[str, torch.Tensor], TensorReport]:
    """One checkpoint tensor -> (tensors to write, report). Only bf16 matrices are encoded: W12N is lossless with
    respect to bf16, and rounding a wider source would not be."""
    keep = TensorReport(key, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."),
                        8.0 * tensor.element_size())
    if tensor.dtype != torch.bfloat16 or tensor.ndim != 2 or any(s in key for s in KEEP_BF16):
        return {key: tensor}, keep
    encoded = w12n.maybe_encode(tensor, segment)
    if encoded is None:
        return {key: tensor}, keep
    s = w12n.stats(encoded)
    return w12n.to_state_dict(key, encoded), TensorReport(key, tuple(tensor.shape), "w12n", s["bits_per_weight"],
                                                          s["escape_rate"], s["verbatim_fraction"])


def inspect(model_dir: str | Path) -> list[TensorReport]:
    """Per-tensor statistics of a model directory or Hub id (W12N planes decoded for their stats, others as
    stored); in a file with checksums every tensor is read and checked."""
    model_dir = resolve_model_dir(str(model_dir))
    reports = []
    for file in safetensors_files(model_dir):
        with CheckpointFile(file) as f:
            for name in f.groups:
                s = w12n.stats(read_w12n(f, name))
                reports.append(TensorReport(name, (s["n"], s["k"]), "w12n", s["bits_per_weight"], s["escape_rate"],
                                            s["verbatim_fraction"]))
            for name in f.names:
                if name not in f.groups:
                    if f.sums is not None:
                        f.read(name)  # checks its checksum
                    dtype = f.handle.get_slice(name).get_dtype().lower()
                    width = {"bf16": 16, "f16": 16, "f32": 32, "f64": 64, "i64": 64, "i32": 32, "u8": 8, "bool": 8}
                    reports.append(TensorReport(name, f.shape(name), dtype, float(width.get(dtype, 0))))
    if not reports:
        raise CheckpointError(f"{model_dir}: no tensors")
    return reports


def totals(reports: list[TensorReport]) -> dict:
    """Weighted totals: bits per weight over all parameters, escape rate and verbatim fraction over W12N ones."""
    def count(r):
        n = 1
        for s in r.shape:
            n *= s
        return n

    all_n = sum(count(r) for r in reports)
    enc = [r for r in reports if r.fmt == "w12n"]
    enc_n = sum(count(r) for r in enc) or 1
    return {"tensors": len(reports), "w12n_tensors": len(enc), "parameters": all_n,
            "bits_per_weight": sum(r.bits_per_weight * count(r) for r in reports) / max(all_n, 1),
            "w12n_bits_per_weight": sum(r.bits_per_weight * count(r) for r in enc) / enc_n,
            "escape_rate": sum(r.escape_rate * count(r) for r in enc) / enc_n,
            "verbatim_fraction": sum(r.verbatim_fraction * count(r) for r in enc) / enc_n}
