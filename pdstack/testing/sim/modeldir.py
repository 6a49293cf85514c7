"""The TEST ENGINE's model directory: what the model phase fetches for the sim inventories (inventory/local, test).

The sim never reads weights, but the model phase must move real files: a config.json, the sim's tokenizer (the
files pdstack/testing/sim/tokenizer holds, so the smoke gate's copy fetched from the lock counts tokens exactly as
the sim does) and a few shards of deterministic bytes (SHA-256 in counter mode, so every checkout writes the same
bytes and the committed locks, inventory/local/model.lock.json and inventory/test/common/model.lock.json, match).
The largest shard is big enough for a rate-limited mirror to be killed half-way through it (the resume test).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pdstack.testing.sim.vocab import rendered_files

NAME = "pdstack-sim"  # the lock's `model`: the basename of pdstack_model.path (/models/pdstack-sim)
SHARDS = {"model-00001-of-00003.safetensors": 1 << 20, "model-00002-of-00003.safetensors": 3 << 20,
          "model-00003-of-00003.safetensors": 8 << 20}


def config() -> dict:
    return {"architectures": ["PdstackSimForCausalLM"], "model_type": "pdstack_sim",
            "pdstack_note": "pdstack sim TEST ENGINE stand-in model: the shards are deterministic filler, not weights",
            "max_position_embeddings": 131072, "num_attention_heads": 64, "num_key_value_heads": 64,
            "torch_dtype": "bfloat16"}


def shard_bytes(name: str, size: int) -> bytes:
    out = bytearray()
    seed = name.encode()
    i = 0
    while len(out) < size:
        out += hashlib.sha256(seed + i.to_bytes(8, "big")).digest()
        i += 1
    return bytes(out[:size])


def files() -> dict[str, bytes]:
    """Relative path -> exact bytes of every file of the model directory."""
    out = {"config.json": (json.dumps(config(), indent=1) + "\n").encode()}
    out.update({name: text.encode() for name, text in rendered_files().items()})
    out.update({name: shard_bytes(name, size) for name, size in SHARDS.items()})
    return out


def write(dest: Path) -> Path:
    """Write the directory (idempotent: a file already holding its bytes is not rewritten)."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel, data in files().items():
        f = dest / rel
        if not f.exists() or f.stat().st_size != len(data) or f.read_bytes() != data:
            tmp = f.with_name(f".{f.name}.tmp")
            tmp.write_bytes(data)
            tmp.replace(f)
    return dest
