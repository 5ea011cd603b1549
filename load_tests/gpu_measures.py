"""What `streamrag bench gpu` measures, one function per figure (gpu_bench.py runs them and reports).

Every engine here has random weights of a named shape (models/llama.py `random_llama_config`): no
weights travel to the GPU machine, and speed does not depend on their values. Prompts are random
token ids, so the engines need no tokenizer.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from inference_svc.engine.engine import Engine, EngineConfig
from inference_svc.engine.events import EventKind
from inference_svc.engine.model_runner import ChunkInput, ModelRunner
from inference_svc.engine.models import ModelConfig
from inference_svc.engine.options import default_token_budget
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.tokenization import SegmentTokenizer
from load_tests.prefill_bench import seconds_of, time_prefill

BLOCK = 16
T = TypeVar("T")


class _IdsOnly:
    """The engines here are given token ids only."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        raise ValueError("bench gpu prompts are token ids")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def timed_ms(fn: Callable[[], object], device: torch.device, repeats: int = 3) -> float:
    """Best of ``repeats`` wall times of ``fn`` (after one warm-up run), the device's work included."""
    fn()
    return min(seconds_of(fn, device) for _ in range(repeats)) * 1e3


def ids(rng: random.Random, n: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.randrange(3, vocab) for _ in range(n))


@dataclass
class EngineSetup:
    config: ModelConfig
    device: torch.device
    dtype: torch.dtype
    attention: str = "auto"
    seed: int = 0
    cuda_graphs: bool = True   # decode graphs captured at start-up (a run without decodes needs none)

    def runner(self, blocks: int, cpu_blocks: int = 0) -> ModelRunner:
        return ModelRunner(self.config, device=self.device, dtype=self.dtype, block_size=BLOCK,
                           num_device_blocks=blocks, num_cpu_blocks=cpu_blocks, seed=self.seed,
                           attention=self.attention, cuda_graphs=self.cuda_graphs)

    def engine(self, blocks: int, *, runner: ModelRunner | None = None, cpu_blocks: int = 0, **config) -> Engine:
        runner = runner or self.runner(blocks, cpu_blocks)
        config.setdefault("token_budget", default_token_budget(str(self.device)))   # the service's default
        return Engine(runner, SegmentTokenizer(_IdsOnly()),
                      EngineConfig(num_device_blocks=blocks, num_cpu_blocks=cpu_blocks, block_size=BLOCK, **config))


def run_until_done(engine: Engine, events: list | None = None, max_steps: int = 100_000) -> list:
    events = [] if events is None else events
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return events
        events += engine.step()
    raise RuntimeError("the engine did not finish")


def tokens_of(events: list, request_id: str) -> list[int]:
    return [e.token_id for e in events if e.request_id == request_id and e.kind is EventKind.TOKEN]


# --- the machine ---------------------------------------------------------------------------

def matmul_tflops(device: torch.device, n: int) -> float:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n ** 3 / timed_ms(lambda: a @ b, device, repeats=5) / 1e9


def copy_tb_s(device: torch.device, mib: int) -> float:
    """A device-to-device copy's bytes read plus written, per second."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / timed_ms(lambda: dst.copy_(src), device, repeats=5) / 1e9


# --- exactness -----------------------------------------------------------------------------

def exactness(setup: EngineSetup, *, doc_tokens: int, max_tokens: int = 12) -> dict:
    """Streamed appends, a replaced middle document and preemption (recompute, swap) against one-shot
    Generate, in fp32: the tokens must be equal; and the last logits of a prompt prefilled in chunks by
    this runner against one shot through the SDPA path (the CPU reference), same weights."""
    rng = random.Random(setup.seed)
    vocab = setup.config.vocab_size
    head = [Segment(token_ids=ids(rng, 2 * doc_tokens, vocab))]
    docs = [Segment(token_ids=ids(rng, doc_tokens, vocab), key=f"d{i}") for i in range(3)]
    other = Segment(token_ids=ids(rng, doc_tokens, vocab), key="other")
    suffix = [Segment(token_ids=ids(rng, 8, vocab))]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    total_blocks = -(-(4 * doc_tokens + 8 + max_tokens) // BLOCK)   # one stream's blocks at its end
    runner = setup.runner(4 * total_blocks, 2 * total_blocks)

    def engine(**config) -> Engine:
        for pool in (runner.kv_cache.device_pool, runner.kv_cache.cpu_pool):
            pool.zero_()
        return setup.engine(config.pop("blocks", 4 * total_blocks), runner=runner, cpu_blocks=2 * total_blocks,
                            **config)

    ref = engine(token_budget=4096)
    ref.open("ref", head + docs, params)
    ref.finish("ref", suffix)
    reference = tokens_of(run_until_done(ref), "ref")

    results = {}
    appends = engine(token_budget=doc_tokens)
    appends.open("s", head, params)
    events: list = []
    for doc in docs:
        appends.append("s", [doc])
        events += appends.step()
    appends.finish("s", suffix)
    results["appends"] = tokens_of(run_until_done(appends, events), "s") == reference

    update = engine(token_budget=doc_tokens)
    update.open("u", head, params)
    update.update("u", [docs[0], other, docs[2]])
    events = []
    for _ in range(3):
        events += update.step()
    update.update("u", docs)
    update.finish("u", suffix)
    results["update"] = tokens_of(run_until_done(update, events), "u") == reference

    for eviction in ("recompute", "swap"):
        # three identical streams, no prefix sharing, in a pool that holds about two of them
        preempt = engine(blocks=2 * total_blocks + 1, token_budget=doc_tokens, eviction=eviction, policy="lcas",
                         enable_prefix_cache=False)
        events = []
        for i in range(3):
            preempt.open(f"p{i}", head, params)
        for doc in docs:
            for i in range(3):
                preempt.append(f"p{i}", [doc])
                events += preempt.step()
        for i in range(3):
            preempt.finish(f"p{i}", suffix)
        run_until_done(preempt, events)
        counters = preempt.counters
        moved = counters.preemptions_recompute if eviction == "recompute" else counters.preemptions_swap
        results[eviction] = moved > 0 and all(tokens_of(events, f"p{i}") == reference for i in range(3))
        results[f"{eviction}_preemptions"] = moved

    prompt = [t for s in head + docs + suffix for t in s.token_ids]
    chunked = _last_logits(runner, prompt, doc_tokens)
    sdpa = EngineSetup(setup.config, setup.device, setup.dtype, attention="sdpa", seed=setup.seed).runner(total_blocks)
    one_shot = _last_logits(sdpa, prompt, len(prompt))
    results["max_logit_diff"] = float((chunked - one_shot).abs().max())
    results["reference_tokens"] = len(reference)
    return results


def _last_logits(runner: ModelRunner, prompt: list[int], chunk: int) -> torch.Tensor:
    table = list(range(-(-len(prompt) // BLOCK)))
    logits = None
    for start in range(0, len(prompt), chunk):
        piece = prompt[start:start + chunk]
        logits = runner.execute([ChunkInput(piece, start, table, start + len(piece) == len(prompt))])
    return logits[0].float().cpu()


# --- prefill -------------------------------------------------------------------------------

def model_flops(config: ModelConfig, tokens: int) -> float:
    """Forward FLOPs of a causal prefill of ``tokens``: the layers' matmuls plus attention (the LM head on
    the last token only, as generate does)."""
    h, kv, d = config.num_heads, config.num_kv_heads, config.head_dim
    per_layer = config.hidden_size * (h * d + 2 * kv * d) + h * d * config.hidden_size \
        + 3 * config.hidden_size * config.intermediate_size
    return 2 * config.num_layers * per_layer * tokens + 2 * config.num_layers * h * d * tokens * tokens


def transformers_model(config: ModelConfig, device: torch.device, dtype: torch.dtype):
    """transformers' own Llama of the same shape, random weights (the baseline a user would reach for)."""
    from transformers import LlamaForCausalLM

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):   # built and initialised in place (its own random init), buffers included
            model = LlamaForCausalLM(config.hf_config)
    finally:
        torch.set_default_dtype(default)
    return model.eval().requires_grad_(False)


# --- decode --------------------------------------------------------------------------------

def decode_steps(engine: Engine, prompts: list[tuple[int, ...]], steps: int, tag: str) -> list[float]:
    """Open ``prompts``, prefill them, then time ``steps`` decode steps of them all (ms each)."""
    params = SamplingParams(max_tokens=steps + 2, ignore_eos=True, speculation="off")   # plain decode steps
    for i, prompt in enumerate(prompts):
        engine.open(f"{tag}{i}", [Segment(token_ids=prompt)], params)
        engine.finish(f"{tag}{i}")
    while any(not engine.requests[f"{tag}{i}"].is_decoding for i in range(len(prompts))):
        engine.step()
    engine.step()   # the first decode step of all together
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - start) * 1e3)
        if engine.last_step.decode_tokens != len(prompts):
            raise RuntimeError(f"a decode step ran {engine.last_step.decode_tokens} of {len(prompts)} decodes")
    for i in range(len(prompts)):
        engine.abort(f"{tag}{i}")
        engine.release(f"{tag}{i}")
    return times


def transformers_decode_ms(model, batch: int, context: int, steps: int, device: torch.device,
                           rng: random.Random) -> float:
    """Per-token time of transformers' ``generate`` (greedy): (``steps`` + 1 tokens - 1 token) / ``steps``."""
    prompt = torch.tensor([ids(rng, context, model.config.vocab_size) for _ in range(batch)], device=device)

    def gen(n: int) -> None:
        model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

    with torch.inference_mode():
        return (timed_ms(lambda: gen(steps + 1), device, 2) - timed_ms(lambda: gen(1), device, 2)) / steps


# --- streaming -----------------------------------------------------------------------------

def ttft_after_last_doc(engine: Engine, head: tuple[int, ...], docs: list[tuple[int, ...]], gap_ms: float,
                        streamed: bool, tag: str) -> float:
    """ms from the last document's arrival to the first token; documents arrive every ``gap_ms``."""
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    start = time.perf_counter()
    arrivals = [start + (i + 1) * gap_ms / 1e3 for i in range(len(docs))]
    if streamed:
        engine.open(tag, [Segment(token_ids=head)], params)
    sent = 0
    while sent < len(docs):
        now = time.perf_counter()
        while sent < len(docs) and arrivals[sent] <= now:
            if streamed:
                engine.append(tag, [Segment(token_ids=docs[sent])])
            sent += 1
        if sent == len(docs):
            break
        if streamed and engine.has_work():
            engine.step()
        else:
            time.sleep(max(0.0, min(arrivals[sent] - time.perf_counter(), 0.002)))
    if not streamed:
        engine.open(tag, [Segment(token_ids=head)] + [Segment(token_ids=d) for d in docs], params)
    engine.finish(tag, [Segment(token_ids=(5, 6, 7, 8))])
    last = arrivals[-1]
    while True:
        for event in engine.step():
            if event.request_id == tag and event.kind is EventKind.TOKEN:
                ttft = (time.perf_counter() - last) * 1e3
                run_until_done(engine)
                engine.release(tag)
                return ttft


def median_and_spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


# --- the bench's sections (gpu_bench.py runs them in order) -------------------------------

def machine_section(device: torch.device, plan: dict, say) -> dict:
    import triton

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"
    say(f"machine: {name}; measuring matmul and copy rates")
    return {"gpu": name, "device": str(device), "torch": torch.__version__, "triton": triton.__version__,
            "small": plan["shape"] == "tiny", "shape": plan["shape"],
            "dtype": str(plan["dtype"]).removeprefix("torch."),
            "matmul_tflops": _sig(matmul_tflops(device, plan["matmul_n"])),
            "hbm_tb_s": _sig(copy_tb_s(device, plan["copy_mib"]))}


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def prefill_section(runner, hf, config, plan: dict, tflops: float, say) -> list[dict]:
    """Prefill MFU one shot and in chunks, ours beside transformers' forward (prefill_bench.time_prefill)."""
    lengths, chunk = plan["prefill"], plan["prefill_chunk"]
    results = baseline(lambda: time_prefill(runner, hf, prompt_lengths=lengths, chunk_tokens=chunk, repeats=2,
                                            progress=None))
    failed = None
    if isinstance(results, str):   # transformers' side failed: ours alone, and why
        failed, results = results, time_prefill(runner, None, prompt_lengths=lengths, chunk_tokens=chunk,
                                                repeats=2, progress=None)
    theirs = {(r.prompt_tokens, r.chunk_tokens): r.seconds for r in results if r.engine == "transformers"}
    rows = []
    for r in results:
        if r.engine != "streamrag":
            continue
        flops = model_flops(config, r.prompt_tokens)
        row = {"tokens": r.prompt_tokens, "chunk": r.chunk_tokens, "ms": round(r.seconds * 1e3, 2),
               "mfu": round(flops / (r.seconds * 1e12) / tflops, 3)}
        key = (r.prompt_tokens, r.chunk_tokens)
        if key in theirs:
            row["transformers_mfu"] = round(flops / (theirs[key] * 1e12) / tflops, 3)
        elif failed is not None:
            row["transformers_mfu"] = failed
        rows.append(row)
        say(f"prefill {r.prompt_tokens} tokens, chunk {r.chunk_tokens}: {row['ms']:.1f} ms, MFU {row['mfu']:.2f}"
            + (f" (transformers {row['transformers_mfu']})" if "transformers_mfu" in row else ""))
    return rows


def decode_section(engine, hf, config, plan: dict, hbm_tb_s: float, args, say) -> list[dict]:
    """Decode step ms at each concurrency over ``plan["context"]``-token prompts, then at concurrency 1 over
    each of ``plan["long_contexts"]`` (where the KV read per step is a large share of the roofline)."""
    rows = []
    rng = random.Random(2)
    model = engine.runner.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head is not None:   # the embedding table is read a row per token, not whole
        weight_bytes -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    kv_per_token = engine.runner.bytes_per_block // BLOCK
    points = [(c, plan["context"]) for c in plan["concurrency"]] + [(1, n) for n in plan.get("long_contexts", ())]
    for c, length in points:
        prompts = [ids(rng, length + i, config.vocab_size) for i in range(c)]
        fresh = decode_steps(engine, prompts, plan["steps"], f"f{c}-{length}-")
        repeated = decode_steps(engine, prompts, plan["steps"], f"r{c}-{length}-")
        context = sum(len(p) for p in prompts) + c * (plan["steps"] // 2)
        roofline_ms = (weight_bytes + context * kv_per_token) / (hbm_tb_s * 1e9)
        fresh_ms, repeated_ms = statistics.median(fresh), statistics.median(repeated)
        row = {"concurrency": c, "context": length, "fresh_step_ms": round(fresh_ms, 3),
               "repeated_step_ms": round(repeated_ms, 3), "fresh_over_repeated": round(fresh_ms / repeated_ms, 3),
               "roofline_ms": round(roofline_ms, 3), "roofline_fraction": round(roofline_ms / fresh_ms, 3),
               "kv_share_of_roofline": round(context * kv_per_token / (weight_bytes + context * kv_per_token), 3),
               "fresh_step_ms_range": [round(min(fresh), 3), round(max(fresh), 3)]}
        if hf is not None and length == plan["context"]:
            row["transformers_step_ms"] = baseline(lambda c=c: round(transformers_decode_ms(
                hf, c, plan["context"], plan["steps"], engine.runner.device, rng), 3))
            if args.compile_transformers and c == 1:
                row["transformers_compiled_step_ms"] = _compiled_transformers(hf, plan, engine.runner.device, rng)
        rows.append(row)
        say(f"decode x{c} over {length}: fresh {fresh_ms:.2f} ms, repeated {repeated_ms:.2f} ms, "
            f"roofline {roofline_ms:.2f} ms ({row['roofline_fraction']:.0%})"
            + (f", transformers {row['transformers_step_ms']} ms" if "transformers_step_ms" in row else ""))
    return rows


def _compiled_transformers(hf, plan: dict, device: torch.device, rng) -> float | str:
    def run() -> float:
        hf.generation_config.cache_implementation = "static"
        hf.forward = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)
        return round(transformers_decode_ms(hf, 1, plan["context"], plan["steps"], device, rng), 3)

    return baseline(run)


def baseline(fn: Callable[[], T]) -> T | str:
    """A baseline's figure, or why it failed: a baseline that does not run here is reported, not fatal."""
    try:
        return fn()
    except Exception as exc:
        return f"failed: {type(exc).__name__}: {exc}"[:200]


def device_calls_section(setup, runner, plan: dict, say) -> tuple[float | None, float | None]:
    engine = setup.engine(plan["blocks"], runner=runner, count_device_calls=True)
    rng = random.Random(3)
    c = plan["concurrency"][min(1, len(plan["concurrency"]) - 1)]
    prompts = [ids(rng, plan["context"], setup.config.vocab_size) for _ in range(c)]
    syncs, launches = [], []
    params = SamplingParams(max_tokens=8, ignore_eos=True, speculation="off")
    for i, prompt in enumerate(prompts):
        engine.open(f"c{i}", [Segment(token_ids=prompt)], params)
        engine.finish(f"c{i}")
    while engine.has_unfinished():
        engine.step()
        last = engine.last_step
        if last.decode_tokens == c and last.tokens == c and last.host_syncs is not None:
            syncs.append(last.host_syncs)
            if last.launches is not None:
                launches.append(last.launches)
    if not syncs:
        say("launches and syncs: not counted on a CPU")
        return None, None
    launched = statistics.median(launches) if launches else None   # None: the profiler saw no CUDA calls
    say(f"per decode step at concurrency {c}: {launched} launches, {statistics.median(syncs)} host syncs")
    return statistics.median(syncs), launched


def streaming_section(setup, runner, plan: dict, say) -> list[dict]:
    rows = []
    rng = random.Random(4)
    for gap in (100, 25):
        pairs = []
        for run in range(plan["runs"]):   # fresh documents each run: no prefix cache hit between runs
            head = ids(rng, plan["head"], setup.config.vocab_size)
            docs = [ids(rng, plan["doc"], setup.config.vocab_size) for _ in range(plan["docs"])]
            engine = setup.engine(plan["blocks"], runner=runner)
            streamed = ttft_after_last_doc(engine, head, docs, gap, True, f"s{run}")
            engine = setup.engine(plan["blocks"], runner=runner)
            whole = ttft_after_last_doc(engine, head, docs, gap, False, f"n{run}")
            pairs.append((streamed, whole))
        streamed = statistics.median(p[0] for p in pairs)
        whole = statistics.median(p[1] for p in pairs)
        rows.append({"gap_ms": gap, "streamed_ttft_ms": round(streamed, 2), "not_streamed_ttft_ms": round(whole, 2),
                     "speedup": round(whole / streamed, 3),
                     "speedups": [round(w / s, 3) for s, w in pairs]})
        say(f"streaming, {gap} ms gaps: {streamed:.1f} ms against {whole:.1f} ms not streamed "
            f"({whole / streamed:.2f}x)")
    return rows


def free_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
