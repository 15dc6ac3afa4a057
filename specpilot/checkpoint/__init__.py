"""Checkpoint file I/O, below `weights/` and `models/`: where a checkpoint is (a local directory or a Hub id,
`directory.py`), which safetensors files hold it (pickles refused), opening one with a clear diagnosis of a
damaged file and reading it tensor by tensor with each tensor's CRC-32 checked (`file.py`, `checksum.py`), the
`CheckpointError` every such failure raises (`errors.py`), and the staging directory an output directory is
written into before it is renamed into place (`staging.py`).

It knows no storage format: a group of plane tensors (`file.PLANE_GROUP_MARK`) is read back as checked raw
planes, and `weights/` turns them into weights. It imports nothing from `specpilot` but `config.py` and
`cli_util.py`.
"""
