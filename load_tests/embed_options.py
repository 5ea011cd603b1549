"""Which embedding backend to index with: passages/s, and recall@10 against float32.

    streamrag bench embed --json OUT --passages 2000 [--sweep]

A seeded sample of the default corpus's passages (split as `index build` does) is embedded
by each option, longest first; runs go round-robin over the options (a busy neighbour slows
them alike) and each option's time is the median. Queries are prose sentences from passages
outside the sample (`recall@10`: |top 10 by the option ∩ top 10 by torch float32| / 10) and
inside it (`hit@10`: own passage in the top 10), embedded by the same option as the passages.
`cos` compares each passage's vector with its float32 one; `others` is the largest share of
the CPU that other processes took during a run (0% is a clean measurement). `--sweep` times
batch sizes on a quarter of the sample, and the default backend without length sorting.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from load_tests.runner import write_json

Encode = Callable[[list[str], int], np.ndarray]
REFERENCE = "torch-fp32"
# --avx2: PyTorch (ATen, MKL, oneDNN) and OpenVINO's oneDNN kernels kept to AVX2, as on an
# AVX2-only CPU. ONNX Runtime's kernels and some of OpenVINO's own are not capped by these.
AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def _torch_variant(name: str, prepare: Callable) -> Callable[[], Encode]:
    """An encoder on the sentence-transformers model after `prepare(model)` (no autocast)."""

    def make() -> Encode:
        import torch
        from sentence_transformers import SentenceTransformer

        from retriever_svc.corpus.embedding import Embedder, embedding_model_path

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # torch.ao.quantization is deprecated in favour of torchao
            model = prepare(SentenceTransformer(str(embedding_model_path()), device="cpu", local_files_only=True))

        def infer(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                out = model({"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)})
            return torch.nn.functional.normalize(out["sentence_embedding"].float(), dim=1).numpy()

        return Embedder(name, model.tokenizer, infer).encode

    return make


def options() -> dict[str, tuple[str, Callable[[], Encode]]]:
    import torch

    from retriever_svc.corpus.embedding import load_embedder

    def backend(name: str, dtype: str = "float32") -> Callable[[], Encode]:
        return lambda: load_embedder(name, dtype).encode

    return {
        "torch-fp32": ("sentence-transformers, PyTorch float32 (what an AVX2 CPU runs today)", backend("torch")),
        "torch-bf16": ("the same under bfloat16 autocast (today's `auto` on a CPU with native bf16)",
                       backend("torch", "bfloat16")),
        "torch-bf16w": ("the model cast to bfloat16 whole, weights and all (no autocast)",
                        _torch_variant("torch-bf16w", lambda model: model.bfloat16())),
        "torch-int8": ("PyTorch dynamic int8 quantization of the Linear layers (activations per batch)",
                       _torch_variant("torch-int8", lambda model: torch.ao.quantization.quantize_dynamic(
                           model, {torch.nn.Linear}, dtype=torch.qint8))),
        "onnx-fp32": ("ONNX Runtime, exported graph with fused attention, float32", backend("onnx")),
        "onnx-int8": ("ONNX Runtime, the same graph, int8 weights per channel (dynamic)", backend("onnx-int8")),
        "openvino-fp32": ("OpenVINO on the exported graph, float32", backend("openvino")),
        "openvino-bf16": ("OpenVINO on the exported graph, bfloat16 (AMX / AVX512-BF16)",
                          backend("openvino", "bfloat16")),
    }


def sample(passages: list, size: int, queries: int, seed: int) -> tuple[list[str], list[str], list[str], list[int]]:
    """(passage inputs, outside queries, inside queries, the inside queries' rows)."""
    from load_tests.retrieval_bench import derive_queries
    from retriever_svc.corpus.index import passage_input

    rows = random.Random(seed).sample(range(len(passages)), min(size, len(passages)))
    chosen = set(rows)
    outside = [passages[i].text for i in range(len(passages)) if i not in chosen]
    texts = [passage_input(passages[i]) for i in rows]
    inside = [(r, found[0]) for r in random.Random(seed + 1).sample(range(len(rows)), min(queries, len(rows)))
              if (found := derive_queries([passages[rows[r]].text], 1, seed))]
    return texts, derive_queries(outside, queries, seed), [q for _, q in inside], [r for r, _ in inside]


def top_k(queries: np.ndarray, passages: np.ndarray, k: int = 10) -> np.ndarray:
    scores = queries @ passages.T
    top = np.argpartition(-scores, k, axis=1)[:, :k]
    return np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), axis=1), 1)


def quality(vectors: np.ndarray, outside: np.ndarray, inside: np.ndarray, inside_of: list[int],
            reference: dict) -> dict:
    top = top_k(outside, vectors)
    overlap = [len(set(a) & set(b)) / 10 for a, b in zip(top, reference["top"], strict=True)]
    hits = [row in found for row, found in zip(inside_of, top_k(inside, vectors), strict=True)]
    cos = np.sum(vectors * reference["vectors"], axis=1)
    return {"recall_at_10": round(float(np.mean(overlap)), 4), "hit_at_10": round(float(np.mean(hits)), 4),
            "cos_mean": round(float(cos.mean()), 6), "cos_min": round(float(cos.min()), 6)}


def cpu_ticks() -> tuple[int, int, int]:
    """(busy ticks of the machine, all its ticks, ticks of this process) from /proc."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    own = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields), int(own[11]) + int(own[12])


def timed(encode: Encode, texts: list[str], batch: int) -> tuple[float, np.ndarray, float]:
    """(seconds, vectors, share of the machine's CPU time that other processes used meanwhile)."""
    before, started = cpu_ticks(), time.perf_counter()
    vectors = encode(texts, batch)
    elapsed, after = time.perf_counter() - started, cpu_ticks()
    busy, total, own = (a - b for a, b in zip(after, before, strict=True))
    return elapsed, vectors, max(0.0, (busy - own) / max(total, 1))


def machine() -> dict:
    from servicekit.hardware import cpu_flags, resolve_dtype

    model = next((line.partition(":")[2].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    flags = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"})
    return {"cpu": model, "cores": len(os.sched_getaffinity(0)), "flags": flags,
            "auto_dtype": resolve_dtype("auto"), "load_average_at_start": os.getloadavg()[0]}


def run(args: argparse.Namespace) -> dict:
    from retriever_svc.corpus.embedding import EMBED_BACKEND, load_embedder
    from retriever_svc.corpus.extract import extract_tree
    from retriever_svc.corpus.index import DEFAULT_SOURCE
    from retriever_svc.corpus.passages import split_page

    today = "torch-bf16" if machine()["auto_dtype"] == "bfloat16" and not args.avx2 else REFERENCE
    chosen = {k: v for k, v in options().items() if k in {REFERENCE, today, *(args.options or options())}}
    tokenizer = load_embedder("torch", "float32").tokenizer      # not the default: --avx2 can't load bf16
    count = lambda text: len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])  # noqa: E731
    passages = [p for page in extract_tree(DEFAULT_SOURCE) for p in split_page(page, count_tokens=count)]
    texts, outside, inside, inside_of = sample(passages, args.passages, args.queries, args.seed)
    print(f"{len(passages)} passages in the corpus, {len(texts)} sampled; {len(outside)} + {len(inside)} queries",
          file=sys.stderr)
    encoders = {name: make() for name, (_, make) in chosen.items()}
    for encode in encoders.values():
        encode(texts[:args.batch], args.batch)                 # load, compile, warm up
    seconds: dict[str, list[float]] = {name: [] for name in encoders}
    others: dict[str, list[float]] = {name: [] for name in encoders}
    vectors: dict[str, np.ndarray] = {}
    for r in range(args.runs):
        for name, encode in encoders.items():
            elapsed, vectors[name], other = timed(encode, texts, args.batch)
            seconds[name].append(elapsed)
            others[name].append(other)
            print(f"run {r + 1}/{args.runs} {name}: {len(texts) / elapsed:.1f} passages/s "
                  f"(other processes: {other:.0%} of the CPU)", file=sys.stderr)
    reference = {"vectors": vectors[REFERENCE]}
    reference["top"] = top_k(encoders[REFERENCE](outside, args.batch), reference["vectors"])
    rows = []
    for name, encode in encoders.items():
        rows.append({"option": name, "description": chosen[name][0],
                     "passages_per_s": round(len(texts) / statistics.median(seconds[name]), 2),
                     "run_seconds": [round(s, 2) for s in seconds[name]],
                     "others_cpu_share": [round(o, 3) for o in others[name]],
                     **quality(vectors[name], encode(outside, args.batch), encode(inside, args.batch), inside_of,
                               reference)})
    rate_of = {row["option"]: row["passages_per_s"] for row in rows}
    for row in rows:
        row["vs_fp32"] = round(row["passages_per_s"] / rate_of[REFERENCE], 2)
        row["vs_today"] = round(row["passages_per_s"] / rate_of[today], 2)
    result = {"machine": machine(), "passages": len(texts), "corpus_passages": len(passages),
              "queries_outside": len(outside), "queries_inside": len(inside), "batch": args.batch,
              "runs": args.runs, "seed": args.seed, "today": today, "default_backend": EMBED_BACKEND,
              "avx2_caps": AVX2_CAPS if args.avx2 else None, "options": rows}
    save(result, args.json)                                    # before the sweep, which is long
    if args.sweep:
        encoders[f"default ({EMBED_BACKEND})"] = load_embedder(dtype="float32" if args.avx2 else "auto").encode
        result["batch_sweep"] = sweep(encoders, texts[::4], args.batches)
    return result


def sweep(encoders: dict[str, Encode], texts: list[str], batches: list[int]) -> list[dict]:
    """passages/s of each option at each batch size (one run); the default backend also
    without length sorting (one call per batch, in arrival order)."""
    rows = []
    for name, encode in encoders.items():
        rates = {str(b): round(len(texts) / timed(encode, texts, b)[0], 2) for b in batches}
        rows.append({"option": name, "sorted": True, "passages_per_s": rates})
        print(f"sweep {name}: {rates}", file=sys.stderr)
    name, encode = list(encoders.items())[-1]

    def arrival_order(texts: list[str], b: int) -> np.ndarray:
        return np.concatenate([encode(texts[i:i + b], b) for i in range(0, len(texts), b)])

    shuffled = random.Random(0).sample(texts, len(texts))
    unsorted = {str(b): round(len(texts) / timed(arrival_order, shuffled, b)[0], 2) for b in batches}
    rows.append({"option": name, "sorted": False, "passages_per_s": unsorted})
    print(f"sweep {name} unsorted: {unsorted}", file=sys.stderr)
    return rows


def save(result: dict, path: Path | None) -> None:
    if path:
        write_json(path, result)


def print_table(result: dict) -> None:
    m = result["machine"]
    print(f"\n{result['passages']} passages, batch {result['batch']}, median of {result['runs']} runs; "
          f"{m['cpu']}, {m['cores']} cores, {' '.join(m['flags'])}; today's auto = {result['today']}"
          + ("; kernels capped at AVX2" if result["avx2_caps"] else ""))
    print(f"{'option':15} {'passages/s':>10} {'x today':>8} {'x fp32':>7} {'recall@10':>9} {'hit@10':>7} "
          f"{'cos mean':>9} {'cos min':>8} {'others':>6}")
    for r in result["options"]:
        print(f"{r['option']:15} {r['passages_per_s']:10.1f} {r['vs_today']:8.2f} {r['vs_fp32']:7.2f} "
              f"{r['recall_at_10']:9.3f} {r['hit_at_10']:7.3f} {r['cos_mean']:9.5f} {r['cos_min']:8.5f} "
              f"{max(r['others_cpu_share']):6.0%}")
    for r in result.get("batch_sweep", []):
        rates = "  ".join(f"b{b}: {v:.1f}" for b, v in r["passages_per_s"].items())
        print(f"{r['option']:26} {'sorted' if r['sorted'] else 'unsorted':8} {rates}")


def add_bench_embed_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--passages", type=int, default=2000, help="sample size")
    parser.add_argument("--queries", type=int, default=200, help="queries of each kind")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--options", nargs="*", help=f"a subset (always with {REFERENCE} and today's)")
    parser.add_argument("--sweep", action="store_true", help="also time batch sizes and unsorted batching")
    parser.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=[8, 16, 32, 64, 128])
    parser.add_argument("--avx2", action="store_true", help="keep PyTorch and OpenVINO to AVX2 kernels "
                        "(float32 options only), as on an AVX2-only CPU")


def run_bench_embed(args: argparse.Namespace) -> int:
    if args.avx2:
        os.environ.update(AVX2_CAPS)
        args.options = ["torch-fp32", "openvino-fp32"]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run(args)
    save(result, args.json)
    print_table(result)
    return 0

