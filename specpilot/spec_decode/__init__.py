"""Speculative decoding: draft trees, drafters, greedy acceptance and token forcing."""
