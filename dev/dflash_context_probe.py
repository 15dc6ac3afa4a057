"""Issue 32 probe: how closely a zoo hybrid DFlash drafter's q follows the target's p on greedy and on sampled
text. On 6 held-out rollouts (128-token corpus prompts, 128 generated tokens, greedy or sampled at T 1; the cached
streams `train drafter --rollouts 96 --rollout-temperature 0 1 --rollout-prompt-len 128 --seq-len 256` uses), at 60
anchors per row: KL(p || q) per draft position and the agreement of the two top tokens. One JSON line per
(rows, drafter).

    OMP_NUM_THREADS=1 python3 dev/dflash_context_probe.py DRAFTER_DIR [DRAFTER_DIR ...]
"""

import json
import sys
from pathlib import Path

import torch

from specpilot.models.loader import load_model, load_tokenizer
from specpilot.train.corpus import load_corpus
from specpilot.train.dflash import DFlashModel, _load_init, _target_outputs, dflash_forward, draft_config, soft_label_kl
from specpilot.train.rollouts import rollout_stream
from specpilot.train.tokens import corpus_tokens

TARGET = "zoo/hybrid"


def main(drafters: list[str]) -> None:
    target = load_model(TARGET, "cpu", "float32").requires_grad_(False)
    _, held = corpus_tokens(load_corpus(None, max_files=12000), load_tokenizer(TARGET))
    for temperature in (0.0, 1.0):
        tokens = rollout_stream(target, TARGET, held, 6, 256, 128, 256, 1, temperature).reshape(6, 256)
        with torch.no_grad():
            features, logits = _target_outputs(target, tokens, (1, 4, 7))
            anchors = torch.arange(128, 248, 2)[None].expand(6, -1)
            seq = torch.arange(6).repeat_interleave(anchors.shape[1])
            at = anchors.reshape(-1)[:, None] + torch.arange(7)
            p = logits[seq[:, None], at]
            for path in drafters:
                model = DFlashModel(draft_config(target.config, 3, 384), 3)
                _load_init(model, Path(path), (1, 4, 7), 8, 1)
                q = dflash_forward(model, target, features, tokens, anchors, 8, 1)
                print(json.dumps({"rows": "greedy" if temperature == 0 else f"sampled at T {temperature}",
                                  "drafter": path,
                                  "kl_per_position": [round(v, 3) for v in soft_label_kl(q, p).mean(0).tolist()],
                                  "top1_agreement": [round(v, 3) for v in
                                                     (q.argmax(-1) == p.argmax(-1)).float().mean(0).tolist()]}))


if __name__ == "__main__":
    main(sys.argv[1:])
