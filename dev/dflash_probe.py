"""Issue 6 probe: what raises a zoo DFlash drafter's acceptance. One variant per process (run them side by side on
one GPU); each trains a drafter for the given zoo target with the zoo's recipe except for the named change, and
writes its training.json (held-out first-token accuracy, per-position accuracy, chain-tau proxy on held-out
rollouts).

    python3 dev/dflash_probe.py VARIANT OUT_DIR [TARGET]      (VARIANT prep: only build the shared rollouts)
"""

import dataclasses
import json
import sys

from specpilot.train import dflash
from specpilot.train.corpus import load_corpus
from specpilot.train.dflash import train_dflash
from specpilot.train.lm import TrainConfig

RECIPE = dict(block=8, num_layers=2, anchors=64, rollouts=12288, rollout_prompt_len=384, target_layers=(1, 4, 7))
VARIANTS = {  # name: (change to RECIPE, steps)
    "base": ({}, 2600),
    "win32": ({"context_window": 32}, 2600),
    "layers3": ({"num_layers": 3}, 2600),
    "roll4x": ({"rollouts": 49152}, 2600),
    "steps2x": ({}, 5200),
    "l3i384": ({"num_layers": 3, "intermediate_size": 384}, 3600),
    "l4i256": ({"num_layers": 4, "intermediate_size": 256}, 4000),
    # the hybrid drafter in the zoo (eleventh session): two jobs side by side ran 5,200 steps in 364 s
    "l3i384s5200": ({"num_layers": 3, "intermediate_size": 384}, 5200),
    "l3i384s5200seed1": ({"num_layers": 3, "intermediate_size": 384, "seed": 1}, 5200),  # run-to-run spread
}

if __name__ == "__main__":
    name, out = sys.argv[1], sys.argv[2]
    target = sys.argv[3] if len(sys.argv) > 3 else "zoo/dense"
    change, steps = VARIANTS.get(name, ({}, 0))
    change = dict(change)
    seed = change.pop("seed", 0)
    if seed:  # another init and batch order over the same cached rollouts (seed 0's), so proxies stay comparable
        rollouts = dflash._rollouts
        dflash._rollouts = lambda *a, **k: rollouts(*a[:5], dataclasses.replace(a[5], seed=0), *a[6:], **k)
    cfg = TrainConfig(steps=steps, batch_size=16, seq_len=512, lr=2e-3, warmup=100, device="cuda", save_every=10**6,
                      seed=seed)
    report = train_dflash(load_corpus(None, max_files=12000), target, out, cfg, **{**RECIPE, **change})
    print(json.dumps({"variant": name, **report}))
