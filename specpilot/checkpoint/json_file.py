"""write_json: a JSON file written whole or not at all (a temp file beside it, then a rename), for the small
records the engine and the pilot cache (cost curves, calibrations, recipes)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: str | Path, data) -> None:
    """Creates the parent folders; a reader never sees half a file and a failure leaves no temp file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, default=str))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
