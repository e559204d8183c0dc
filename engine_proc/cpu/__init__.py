"""The CPU's matmul machinery: what the CPU has, the C++ kernels and their build, GGUF blocks in
kernel forms, the per-shape plan of which form runs, and the layers that run them. Imports nothing
else of engine_proc: models, the loader and the engine loop build on it."""
