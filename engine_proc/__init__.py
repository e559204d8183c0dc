"""The engine process: EngineCore (scheduler, KV cache, model runner, sampler) and its socket threads."""
