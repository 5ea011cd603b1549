"""A blend scenario on the runner, and its outputs in fp32 as recorded from the gather-based blend forward.

One step mixes a decode, a plain prefill chunk and two blended chunks (one at position 0 whose passages
come from the device and from the CPU pool, one over a cached prefix); greedy decodes follow over the
blended KV. `run` returns, per recompute share, the step's logits (top entries), the blended chunks'
KV sums per layer and the greedy tokens. `blend_reference.json` holds what the gather-based forward
gave; test_blend_reference.py checks every attention implementation against it.

    python -m tests.engine.blend_scenario     # rewrites blend_reference.json (the reference path only)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from inference_svc.engine.chunk_store import ChunkReuse, ReusedSpan
from inference_svc.engine.model_runner import ChunkInput, ModelRunner

REFERENCE = Path(__file__).with_name("blend_reference.json")
FRACTIONS = (0.0, 0.3, 1.0)
BLOCK = 16
TOP = 8
DECODES = 4

HEAD_A = "<|im_start|>system\nAnswer using the documents.<|im_end|>\n<|im_start|>user\n"
HEAD_B = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQuestion: how do I read a file?\n"
DOCS = ("[files] Use open() to read a file. The with statement closes the file for you, even when an "
        "exception is raised.\n",
        "[io] The io module provides buffered streams. read() returns the whole content, readline() one line.\n",
        "[dicts] A dict maps keys to values; get() returns a default for a missing key, and items() pairs.\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
PLAIN = "The river bends twice before it reaches the old mill, where the water slows and turns green."


def runner(model_dir: Path, attention: str = "auto") -> ModelRunner:
    return ModelRunner(model_dir, dtype=torch.float32, block_size=BLOCK, num_device_blocks=96, num_cpu_blocks=24,
                       attention=attention)


def _table(first: int, tokens: int) -> list[int]:
    return list(range(first, first + -(-tokens // BLOCK)))


def _slots(table: list[int], start: int, length: int) -> torch.Tensor:
    positions = torch.arange(start, start + length)
    return torch.tensor(table)[positions // BLOCK] * BLOCK + positions % BLOCK


def _top(logits: torch.Tensor) -> list[dict]:
    values, indices = logits.topk(TOP, dim=-1)
    return [dict(ids=i.tolist(), values=v.tolist()) for i, v in zip(indices, values, strict=True)]


def run(model: ModelRunner, encode, fraction: float, *, filled_by: ModelRunner | None = None,
        decodes: int = DECODES) -> dict:
    """The scenario at one recompute share, on a runner whose pools it zeroes first. With ``filled_by``,
    that runner computes the first step (no blend in it) and ``model`` starts from a copy of its pools."""
    filler = filled_by or model
    for pool in (filler.kv_cache.device_pool, filler.kv_cache.cpu_pool):
        pool.zero_()
    head_a, head_b, suffix, plain = encode(HEAD_A), encode(HEAD_B), encode(SUFFIX), encode(PLAIN)
    docs = [encode(d) for d in DOCS]
    at = [len(head_a), len(head_a) + len(docs[0]), len(head_a) + len(docs[0]) + len(docs[1])]
    seq_a = head_a + docs[0] + docs[1] + docs[2]
    ta = _table(0, len(seq_a) + 16)
    filler.execute([ChunkInput(seq_a, 0, ta, True), ChunkInput(head_b, 0, _table(64, 200), False)])
    filler.swap_out([(block, i) for i, block in enumerate(ta)])          # the same passages on the CPU
    if filler is not model:
        model.kv_cache.device_pool.copy_(filler.kv_cache.device_pool)
        model.kv_cache.cpu_pool.copy_(filler.kv_cache.cpu_pool)
    cpu_blocks = tuple(range(len(ta)))

    def span(start: int, doc: int, on_cpu: bool = False) -> ReusedSpan:
        return ReusedSpan(start, len(docs[doc]), cpu_blocks if on_cpu else tuple(ta), on_cpu, at[doc], 0)

    q_ids = head_b + docs[1] + docs[0] + suffix                          # blended from position 0
    tq = _table(32, len(q_ids) + 16)
    q_reuse = ChunkReuse((span(len(head_b), 1), span(len(head_b) + len(docs[1]), 0, on_cpu=True)), (), fraction)
    r_start = len(head_b)                                                # blended over a cached prefix
    r_ids = docs[2] + docs[0] + suffix
    tr = _table(64, 200)
    r_reuse = ChunkReuse((span(r_start, 2), span(r_start + len(docs[2]), 0)), (), fraction)
    ts = _table(80, len(plain) + 16)
    chunks = [ChunkInput(q_ids, 0, tq, True, num_logits=2, reuse=q_reuse),
              ChunkInput([42], len(seq_a), ta, True),
              ChunkInput(plain, 0, ts, True),
              ChunkInput(r_ids, r_start, tr, True, reuse=r_reuse)]
    logits = model.execute(chunks)

    flat = model.kv_cache.device_pool.view(model.kv_cache.device_pool.shape[0], 2, -1,
                                           *model.kv_cache.device_pool.shape[4:])
    kv = [flat.index_select(2, _slots(table, 0, end)).sum((2, 3, 4)).tolist()
          for table, end in ((tq, len(q_ids)), (tr, r_start + len(r_ids)))]

    ends = {"q": (tq, len(q_ids)), "a": (ta, len(seq_a) + 1), "s": (ts, len(plain)), "r": (tr, r_start + len(r_ids))}
    last = {"q": logits[1], "a": logits[2], "s": logits[3], "r": logits[4]}
    tokens: dict[str, list[int]] = {name: [] for name in ends}
    for _ in range(decodes):
        step = []
        for name, (table, end) in ends.items():
            token = int(last[name].argmax())
            tokens[name].append(token)
            step.append(ChunkInput([token], end, table, True))
            ends[name] = (table, end + 1)
        out = model.execute(step)
        last = dict(zip(ends, out, strict=True))
    return dict(logits=_top(logits), kv=kv, tokens=tokens)


def encoder(model_dir: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


def main() -> None:
    from inference_svc.embedded_model import prepare_embedded_model

    model_dir = prepare_embedded_model(progress=False)
    model, encode = runner(model_dir, "sdpa"), encoder(model_dir)
    with torch.inference_mode():
        record = {str(f): run(model, encode, f) for f in FRACTIONS}
    REFERENCE.write_text(json.dumps(record, indent=None, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
