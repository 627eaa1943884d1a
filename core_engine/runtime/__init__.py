"""Forward passes over the KV pool, sampling, and CUDA-graph decode."""
