"""A shard of random GPT-2 tokens in llm.c's layout (a 256-int header: magic 20240520, version 1,
the token count; then uint16 tokens), for the GPU benchmarks that time steps, not learning."""
import pathlib


def write_random_gpt2_shard(path, n_tokens, seed=1):
    """Writes `path` unless it exists; tokens drawn uniformly below 50257."""
    path = pathlib.Path(path)
    if path.exists():
        return path
    import numpy as np
    path.parent.mkdir(parents=True, exist_ok=True)
    hdr = np.zeros(256, dtype=np.int32)
    hdr[:3] = (20240520, 1, n_tokens)
    tokens = np.random.default_rng(seed).integers(0, 50257, n_tokens, dtype=np.uint16)
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(tokens.tobytes())
    return path
