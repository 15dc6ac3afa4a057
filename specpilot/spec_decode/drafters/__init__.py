"""Drafters behind one protocol (base.py); registry.py builds one from a CLI name or a checkpoint."""
