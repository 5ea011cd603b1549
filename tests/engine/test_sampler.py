"""Sampler and SamplingParams on synthetic logits (no model needed)."""

from __future__ import annotations

import pytest
import torch

from inference_svc.engine.sampler import Sampler, SamplingParams, make_generator

VOCAB = 1000


@pytest.fixture
def logits() -> torch.Tensor:
    return torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(0)) * 3


def test_greedy_is_argmax(logits):
    params = [SamplingParams()] * 6
    assert Sampler().sample(logits, params, [None] * 6) == logits.argmax(-1).tolist()


def test_same_seed_same_tokens_whatever_the_batch(logits):
    p = SamplingParams(temperature=1.0, seed=1234)
    alone = [Sampler().sample(logits[2:3], [p], [make_generator(p)])[0] for _ in range(2)]
    mixed = Sampler().sample(
        logits[1:4],
        [SamplingParams(temperature=0.7), p, SamplingParams()],
        [None, make_generator(p), None],
    )
    assert alone[0] == alone[1] == mixed[1]

    def draws(seed: int) -> list[int]:
        p = SamplingParams(temperature=1.0, seed=seed)
        g = make_generator(p)
        return [Sampler().sample(logits[:1], [p], [g])[0] for _ in range(20)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_sampling_at_high_temperature_is_not_greedy(logits):
    g = torch.Generator().manual_seed(0)
    p = SamplingParams(temperature=5.0)
    picks = {Sampler().sample(logits[:1], [p], [g])[0] for _ in range(50)}
    assert len(picks) > 10


def test_top_k_one_equals_greedy(logits):
    params = [SamplingParams(temperature=1.5, top_k=1, seed=i) for i in range(6)]
    gens = [make_generator(p) for p in params]
    assert Sampler().sample(logits, params, gens) == logits.argmax(-1).tolist()


def test_tiny_top_p_equals_greedy(logits):
    params = [SamplingParams(temperature=1.0, top_p=1e-6) for _ in range(6)]
    assert Sampler().sample(logits, params, [None] * 6) == logits.argmax(-1).tolist()


def test_top_k_keeps_draws_inside_the_k_best(logits):
    g = torch.Generator().manual_seed(3)
    top5 = set(logits[0].topk(5).indices.tolist())
    p = SamplingParams(temperature=10.0, top_k=5)
    assert {Sampler().sample(logits[:1], [p], [g])[0] for _ in range(100)} <= top5


def test_top_p_keeps_draws_inside_the_nucleus():
    row = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))[None]
    g = torch.Generator().manual_seed(0)
    p = SamplingParams(temperature=1.0, top_p=0.7)  # nucleus: tokens 0 and 1 (0.5 + 0.3 >= 0.7)
    assert {Sampler().sample(row, [p], [g])[0] for _ in range(200)} == {0, 1}


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-0.1),
        dict(temperature=float("nan")),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=-1),
        dict(max_tokens=0),
        dict(max_tokens=10**9),
        dict(seed=-1),
        dict(stop_token_ids=(-5,)),
    ],
)
def test_out_of_range_params_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs).validate()


def test_defaults_are_valid_and_greedy():
    p = SamplingParams().validate()
    assert p.greedy and p.max_tokens == 256 and p.top_k == 0 and p.top_p == 1.0


def test_mismatched_lengths_raise(logits):
    with pytest.raises(ValueError):
        Sampler().sample(logits, [SamplingParams()], [None])
