"""Issue 5 probe: where the W12N tensor-core GEMV loses its time on weights with verbatim segments (random
N(0, 0.02) weights run 10-20% slower than clean ones on the small shapes; neither issuing the pass's first two
segments together nor running the pass before the K loop changed that: both tried in the fourteenth session, and
removed). Times, at M = 1, side by side (weights rotated, CUDA-graph replays as bench/w12n_gemv.py times them):
  clean         clean weights (no escapes, no verbatim segments), encode_best
  clean_s256    the same weights at segment 256 (the segment encode_best picks for random weights)
  clean_vbuild  clean_s256 with a one-row dummy pool: the HAS_VERBATIM build, no segment listed
  random        random weights, encode_best (verbatim segments, listed and added after the K loop)
  random_nopass random weights with every block's list emptied (wrong sums: the pass's cost, by difference)

    PYTHONPATH=. python3 dev/w12n_verbatim_probe.py OUT.json COMMIT
"""

import copy
import dataclasses
import json
import sys

import torch

from bench.gemv import SHAPES, time_fn
from bench.w12n_gemv import random_weights
from specpilot.ops.w12n_gemv import mma
from specpilot.weights import w12n


def variants(n, k, copies):
    clean = [random_weights(n, k, "cuda", True) for _ in range(copies)]
    rand = [random_weights(n, k, "cuda", False) for _ in range(copies)]
    out = {"clean": [w12n.encode_best(w) for w in clean], "clean_s256": [w12n.encode(w, segment=256) for w in clean]}
    out["clean_vbuild"] = [copy.copy(t) for t in out["clean_s256"]]
    for t in out["clean_vbuild"]:  # past the planes' checks on purpose: a pool row no segment points at
        object.__setattr__(t, "verbatim", torch.zeros(1, 256, dtype=torch.bfloat16, device="cuda"))
    out["random"] = [w12n.encode_best(w) for w in rand]
    out["random_nopass"] = [dataclasses.replace(t) for t in out["random"]]  # new objects: their own table cache
    for ts in out.values():
        for t in ts:
            mma.prepare(t)
    for t in out["random_nopass"]:
        vt = mma.verbatim_tables(t)
        mma._VERBATIM[t][False] = dataclasses.replace(vt, vcount=torch.zeros_like(vt.vcount))
    return out


def main():
    path, commit = sys.argv[1], sys.argv[2]
    report = {"gpu": torch.cuda.get_device_name(), "commit": commit, "command": " ".join(sys.argv), "shapes": {}}
    for name in ("27B.down", "27B.o_proj", "8B.down", "8B.o_proj"):
        n, k = SHAPES[name]
        copies = max(2, (512 << 20) // (n * k * 2) + 1)
        vs = variants(n, k, copies)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        row = report["shapes"][name] = {}
        for key, ts in vs.items():
            vt = mma.verbatim_tables(ts[0]) if ts[0].verbatim.shape[0] else None
            us = [time_fn(lambda a, t: mma.w12n_mma_gemv(a, t), ts, x) * 1e6 for _ in range(2)]
            row[key] = {"us": us, "segment": ts[0].segment, "launch": dataclasses.asdict(mma.default_launch(ts[0], 1)),
                        "listed_per_block": None if vt is None else vt.vcount.float().mean().item(),
                        "blocks_listing": None if vt is None else (vt.vcount > 0).float().mean().item()}
        print(name, {k: (round(min(v["us"]), 1), v["segment"], v["listed_per_block"]) for k, v in row.items()},
              flush=True)
        del vs
        torch.cuda.empty_cache()
    json.dump(report, open(path, "w"), indent=1)


if __name__ == "__main__":
    main()
