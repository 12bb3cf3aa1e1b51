"""bls.models: real workers (encoders, vLLM), adapters and caches."""
