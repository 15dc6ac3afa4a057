"""The runtime: the model cache, the model runner (prefill, decode, verify blocks, CUDA graphs) and sampling."""
