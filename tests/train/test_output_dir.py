"""Every trainer's output directory (train/output_dir.py: targets, drafters, tokenizers) is written whole or not at
all: a save that fails part-way leaves no --out (or the previous one as it was, its resume checkpoint included) and
no staging directory; a save over an earlier output replaces its files and keeps the checkpoint; SIGTERM mid-save
exits 143 leaving the previous output as it was."""

import copy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specpilot.models.loader import load_model
from specpilot.train import output_dir as output_module
from specpilot.train.output_dir import output_dir, save_drafter

ROOT = Path(__file__).resolve().parents[2]
KINDS = ["dflash", "dflash2", "dspark", "eagle3", "mtp", "lm", "tokenizer"]


def _fill(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.copy_(torch.randn(p.shape, generator=gen))
    return module


@pytest.fixture
def saver(request, checkpoint_factory, tmp_path):
    """save(out, seed): the trainer's own save function for the kind, on a tiny model with weights from `seed`
    (the tokenizer: trained on a tiny corpus, `seed` more tokens)."""
    kind = request.param
    if kind == "tokenizer":
        from specpilot.train.corpus import load_corpus
        from specpilot.train.tokenizer import train_tokenizer

        for i in range(20):
            (tmp_path / "corpus" / f"m{i}.py").parent.mkdir(exist_ok=True)
            (tmp_path / "corpus" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 4)
        corpus = load_corpus(str(tmp_path / "corpus"), held_out_percent=20)
        return lambda out, seed: train_tokenizer(corpus, out, 270 + seed)
    path, hf = checkpoint_factory("qwen3_5" if kind == "mtp" else "qwen3")
    target = load_model(str(path), "cpu", "float32")
    from specpilot.train.dflash import draft_config

    if kind == "dflash":
        from specpilot.models.dflash import DFlashModel
        from specpilot.train.dflash import save_dflash

        return lambda out, seed: save_dflash(_fill(DFlashModel(draft_config(target.config, 1), 2), seed),
                                             target.config, (0, 1), 4, 300, out, {"seed": seed})
    if kind == "dflash2":
        from specpilot.models.dflash2 import DFlash2Model, DFlash2Options
        from specpilot.train.dflash2 import save_dflash2

        opts = DFlash2Options(4, 300, (0, 1), 2, 16, 8, 4)
        return lambda out, seed: save_dflash2(_fill(DFlash2Model(draft_config(target.config, 1), 2, opts), seed),
                                              target.config, out, {"seed": seed})
    if kind == "dspark":
        from specpilot.models.dspark import DSparkModel, DSparkOptions
        from specpilot.train.dspark import save_dspark

        opts = DSparkOptions(4, 300, (0, 1), 8, True, True, False, False)
        return lambda out, seed: save_dspark(_fill(DSparkModel(draft_config(target.config, 1), opts), seed),
                                             target.config, out, {"anchors": 4, "seed": seed})
    if kind == "eagle3":
        from specpilot.models.eagle3 import Eagle3Head, head_config
        from specpilot.train.eagle3 import head_raw_config, save_eagle3, tap_inputs

        raw = head_raw_config(target.config, 100, tap_inputs(target.config.num_hidden_layers))

        def save(out, seed):
            head = Eagle3Head(head_config(raw, "train"), target.config.hidden_size, 100, False, False)
            save_eagle3(_fill(head, seed), raw, out, {"seed": seed})

        return save
    if kind == "mtp":
        from specpilot.models.mtp import MTPModel
        from specpilot.models.mtp import head_config as mtp_config
        from specpilot.train.mtp import save_mtp

        return lambda out, seed: save_mtp(_fill(MTPModel(mtp_config(target.config)), seed), path, out,
                                          {"seed": seed})
    from specpilot.train.lm import _save_final

    return lambda out, seed: _save_final(_fill(copy.deepcopy(hf), seed), path, out, {"seed": seed}, "float32")


def _fail_at_training_json(monkeypatch) -> None:
    """Every save writes training.json (the tokenizer: tokenizer_training.json) last: failing there leaves the
    weights and config already written."""
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name.endswith("training.json"):
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)


def _contents(out: Path) -> dict[str, bytes]:
    return {str(f.relative_to(out)): f.read_bytes() for f in sorted(out.rglob("*")) if f.is_file()}


def _leftovers(out: Path) -> list[Path]:
    return list(out.parent.glob(f".{out.name}.tmp-*"))


def _checkpoint(out: Path) -> None:
    """What the training loop leaves in --out before the final save: the resume checkpoint."""
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "trainer_state.json").write_text('{"step": 6}')


@pytest.mark.parametrize("saver", KINDS, indirect=True)
def test_a_failed_save_leaves_no_output(saver, tmp_path, monkeypatch):
    out = tmp_path / "out"
    _fail_at_training_json(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        saver(out, 1)
    assert not out.exists() and _leftovers(out) == []


@pytest.mark.parametrize("saver", KINDS, indirect=True)
def test_a_failed_save_leaves_the_previous_output_as_it_was(saver, tmp_path, monkeypatch):
    out = tmp_path / "out"
    saver(out, 1)
    _checkpoint(out)
    before = _contents(out)
    _fail_at_training_json(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        saver(out, 2)
    assert _contents(out) == before and _leftovers(out) == []


@pytest.mark.parametrize("saver", ["dflash2", "mtp"], indirect=True)
def test_a_save_replaces_the_previous_output_and_keeps_its_checkpoint(saver, tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    saver(first, 2)
    saver(again, 1)
    _checkpoint(again)
    (again / "notes.txt").write_text("kept")
    saver(again, 2)
    saved = _contents(again)
    assert saved.pop("checkpoint/trainer_state.json") == b'{"step": 6}' and saved.pop("notes.txt") == b"kept"
    assert saved == _contents(first) and _leftovers(again) == []


def test_a_failed_swap_puts_the_previous_output_back(tmp_path, monkeypatch):
    out = tmp_path / "out"
    save_drafter(out, {"w": torch.ones(2)}, {"a": 1}, {"r": 1})
    _checkpoint(out)
    before = _contents(out)

    def publish(tmp, dst):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(output_module, "publish", publish)
    with pytest.raises(OSError, match="Input/output error"):
        save_drafter(out, {"w": torch.zeros(2)}, {"a": 2}, {"r": 2})
    assert _contents(out) == before and _leftovers(out) == []


def test_output_dir_creates_missing_parents(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    with output_dir(out) as tmp:
        (tmp / "x").write_text("x")
    assert (out / "x").read_text() == "x" and _leftovers(out) == []


def test_sigterm_mid_save_keeps_the_previous_output(tmp_path):
    """save_drafter in its own process over an earlier output, stopped after the new weights are written: exit
    status 143, the earlier output (and its checkpoint) as it was, no staging directory left."""
    out, marker = tmp_path / "out", tmp_path / "written"
    save_drafter(out, {"w": torch.ones(2)}, {"a": 1}, {"r": 1})
    _checkpoint(out)
    before = _contents(out)
    code = (
        "import time\n"
        "from pathlib import Path\n"
        "import safetensors.torch as st\n"
        "import torch\n"
        "from specpilot.train.output_dir import save_drafter\n"
        "real = st.save_file\n"
        "def stalled(*args, **kwargs):\n"
        "    real(*args, **kwargs)\n"
        f"    Path({str(marker)!r}).write_text('written')\n"
        "    time.sleep(300)\n"
        "st.save_file = stalled\n"
        f"save_drafter(Path({str(out)!r}), {{'w': torch.zeros(2)}}, {{'a': 2}}, {{'r': 2}})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the save never reached the stall"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _contents(out) == before and _leftovers(out) == []
