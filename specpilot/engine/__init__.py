"""The runtime: cache, model runner (prefill / decode, CUDA graphs), sampling and the generation loop."""
