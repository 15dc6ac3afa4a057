"""Training recipes for the bundled zoo: corpus, tokenizer, targets and draft models (a leaf: the core never
imports it)."""
