"""The generation loops above the runtime and speculative decoding: plain (Generator) and speculative
(SpecEngine), and the streaming detokenizer."""
