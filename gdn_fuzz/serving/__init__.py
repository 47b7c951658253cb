"""The serving engine: one multi-step simulator of the serving loop (engine), the adapters between it and a
kernel (adapters: direct, packed varlen with a NULL block, CUDA-graphed, Triton) and the Hypothesis state
machine over it (machine)."""
