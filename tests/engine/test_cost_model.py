"""Preemption cost model: piecewise-linear fits, the recompute-vs-swap rule, online refinement, profiles."""

from __future__ import annotations

import itertools
import json

import pytest

from inference_svc.engine.cost_model import CostModel, OnlineScale, PiecewiseLinear, check_profile, profile_path

# --- PiecewiseLinear ----------------------------------------------------------------------


def test_fit_goes_through_the_median_of_repeated_measurements():
    """Repeated measurements at one size collapse to their median; knots come out sorted."""
    fit = PiecewiseLinear.fit([(200, 9.0), (100, 50.0), (100, 1.0), (100, 2.0), (200, 7.0), (200, 8.0)])
    assert fit.xs == [100.0, 200.0]
    assert fit.ys == [2.0, 8.0]
    assert fit(100) == pytest.approx(2.0)
    assert fit(200) == pytest.approx(8.0)


def test_fit_median_ignores_a_single_outlier():
    """One wild measurement among several does not move the knot."""
    fit = PiecewiseLinear.fit([(0, 0.0), (10, 5.0), (10, 5.1), (10, 4.9), (10, 5000.0), (10, 5.0)])
    assert fit(10) == pytest.approx(5.0)


def test_interpolates_linearly_between_knots():
    """Between two knots the value lies on the straight line joining them."""
    fit = PiecewiseLinear.fit([(0, 0.0), (100, 10.0), (300, 50.0)])
    assert fit(50) == pytest.approx(5.0)
    assert fit(200) == pytest.approx(30.0)
    assert fit(250) == pytest.approx(40.0)


def test_flat_below_the_first_size_and_rising_beyond_the_last():
    """Below the first knot the cost stays at its value (a smaller prompt is not free); beyond
    the last the last segment is extended, at least at the average cost per unit."""
    fit = PiecewiseLinear.fit([(100, 10.0), (200, 20.0), (300, 50.0)])
    assert fit(50) == pytest.approx(10.0)
    assert fit(400) == pytest.approx(80.0)  # last segment: slope 0.3 (> the average 50/300)
    assert fit(1000) == pytest.approx(260.0)
    flat_tail = PiecewiseLinear.fit([(100, 10.0), (200, 20.0), (300, 20.0)])
    assert flat_tail(600) == pytest.approx(20.0 + 300 * 20.0 / 300)   # the average, 1/15 ms per unit


def test_never_zero_nor_decreasing():
    """A fit never reaches zero and never decreases, whatever the measurements did."""
    fit = PiecewiseLinear.fit([(100, 1.0), (200, 11.0)])
    assert fit(0) == pytest.approx(1.0) and fit(-1000) == pytest.approx(1.0)
    falling = PiecewiseLinear.fit([(0, 10.0), (10, 5.0)])  # measured falling
    assert falling.adjusted
    assert falling(0) == falling(10) == pytest.approx(7.5)
    assert falling(100) > falling(10)
    assert PiecewiseLinear.fit([(0, 0.0), (10, 0.0)])(5) > 0


@pytest.mark.parametrize("points", [[], [(10, 1.0)], [(10, 1.0), (10, 2.0), (10.0, 3.0)]])
def test_fit_with_fewer_than_two_sizes_raises(points):
    """A fit needs measurements at two or more distinct sizes."""
    with pytest.raises(ValueError):
        PiecewiseLinear.fit(points)


# --- recompute vs swap --------------------------------------------------------------------

BLOCK = 16


def _crossover_model() -> CostModel:
    """Recompute: 1/64 ms/token to 1024 tokens, then 1/16 ms/token; swap: 0.25 ms/block.

    With blocks = tokens/16, 2*swap = tokens/32 ms. Below 1024 tokens recompute (tokens/64) is cheaper.
    Above: 16 + (T-1024)/16 < T/32  <=>  T < 1536. So the decision flips at exactly 1536 tokens
    (where both sides cost 48 ms, and a tie means swap).
    """
    recompute = PiecewiseLinear.fit([(0, 0.0), (1024, 16.0), (4096, 208.0)])
    swap = PiecewiseLinear.fit([(0, 0.0), (256, 64.0)])
    return CostModel(recompute, swap)


def test_prefer_recompute_is_recompute_cheaper_than_two_swaps():
    """The decision is exactly recompute_ms(tokens) < 2 * swap_ms(blocks)."""
    model = _crossover_model()
    for tokens in range(BLOCK, 4097, BLOCK):
        blocks = tokens // BLOCK
        expected = model.recompute_ms(tokens) < 2 * model.swap_ms(blocks)
        assert model.prefer_recompute(tokens, blocks) is expected, tokens


def test_prefer_recompute_flips_at_the_hand_computed_crossover():
    """Recompute for every size below 1536 tokens, swap from 1536 on."""
    model = _crossover_model()
    decisions = {t: model.prefer_recompute(t, t // BLOCK) for t in range(BLOCK, 4097, BLOCK)}
    assert all(decisions[t] for t in decisions if t < 1536)
    assert not any(decisions[t] for t in decisions if t >= 1536)
    assert model.recompute_ms(1536) == pytest.approx(48.0)
    assert 2 * model.swap_ms(96) == pytest.approx(48.0)


def test_equal_costs_choose_swap():
    """At the crossover the costs tie and the strict inequality picks swap."""
    model = _crossover_model()
    assert model.recompute_ms(1536) == 2 * model.swap_ms(1536 // BLOCK)
    assert model.prefer_recompute(1536, 96) is False


def test_swap_counts_twice():
    """Recompute dearer than one swap but cheaper than out-and-back is still recompute."""
    model = CostModel(PiecewiseLinear([0, 100], [0.0, 15.0]), PiecewiseLinear([0, 10], [0.0, 10.0]))
    assert model.recompute_ms(100) == pytest.approx(15.0)
    assert model.swap_ms(10) == pytest.approx(10.0)
    assert model.prefer_recompute(100, 10) is True


def test_zero_sizes_cost_nothing():
    """No tokens or no blocks cost 0 ms whatever the fit's intercept."""
    model = CostModel(PiecewiseLinear([0, 10], [3.0, 13.0]), PiecewiseLinear([0, 10], [1.0, 2.0]))
    assert model.recompute_ms(0) == 0.0
    assert model.swap_ms(0) == 0.0


# --- online refinement --------------------------------------------------------------------


def test_consistently_slow_prefills_scale_recompute_toward_measured():
    """Measurements at 2x the prediction move recompute_ms to ~2x; the swap side is untouched."""
    model = _crossover_model()
    base_recompute = {t: model.recompute_ms(t) for t in (256, 1024, 3000)}
    base_swap = {b: model.swap_ms(b) for b in (1, 50, 300)}
    sizes = [256, 1024, 3000, 512, 2048]
    for i in range(80):
        tokens = sizes[i % len(sizes)]
        model.observe_prefill(tokens, 2.0 * model.recompute(tokens))
    for t, before in base_recompute.items():
        assert model.recompute_ms(t) == pytest.approx(2.0 * before, rel=0.03)
    for b, before in base_swap.items():
        assert model.swap_ms(b) == before
    assert model.swap_scale.samples == 0


def test_online_scale_moves_monotonically_toward_the_ratio():
    """Each observation of a 2x ratio brings the multiplier closer to 2 without overshooting."""
    scale = OnlineScale()
    values = []
    for _ in range(40):
        scale.observe(10.0, 20.0)
        values.append(scale.value)
    assert all(1.0 < a < b <= 2.0 for a, b in itertools.pairwise(values))
    assert scale.samples == 40


def test_swap_observations_scale_only_the_swap_side():
    """Fast swaps lower swap_ms; recompute_ms is unchanged."""
    model = _crossover_model()
    before_recompute = model.recompute_ms(1024)
    before_swap = model.swap_ms(64)
    for _ in range(80):
        model.observe_swap(64, 0.5 * model.swap(64))
    assert model.swap_ms(64) == pytest.approx(0.5 * before_swap, rel=0.03)
    assert model.recompute_ms(1024) == before_recompute


@pytest.mark.parametrize("measured", [0.0, -5.0])
def test_non_positive_measurements_are_ignored(measured):
    """A zero or negative measured time changes nothing."""
    model = _crossover_model()
    model.observe_prefill(1024, measured)
    model.observe_swap(64, measured)
    assert model.recompute_scale.value == 1.0 and model.recompute_scale.samples == 0
    assert model.swap_scale.value == 1.0 and model.swap_scale.samples == 0


def test_one_wild_observation_moves_the_scale_by_a_bounded_step():
    """Where the curve predicts next to nothing, one slow step cannot multiply every prediction."""
    model = CostModel(PiecewiseLinear([100, 200], [0.0, 10.0]), PiecewiseLinear([0, 10], [0.0, 1.0]))
    model.observe_prefill(50, 5.0)  # the curve is at its floor there: the raw ratio is 5,000
    assert model.recompute_scale.samples == 1
    assert model.recompute_scale.value == pytest.approx(1.0 + 0.1 * (8.0 - 1.0))


# --- profiles -----------------------------------------------------------------------------


def _profile() -> dict:
    return {
        "device": "NVIDIA H100 80GB HBM3",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "dtype": "bfloat16",
        "block_size": 16,
        "recompute_ms": [[1024, 40.0], [1024, 42.0], [1024, 41.0], [8192, 300.0], [32768, 1500.0]],
        "swap_ms": [[1, 0.2], [64, 6.0], [64, 6.5], [64, 5.5], [1024, 90.0]],
    }


def test_profile_round_trip_gives_the_same_predictions(tmp_path):
    """A profile written as JSON and loaded back predicts exactly what from_profile does."""
    profile = _profile()
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    loaded = CostModel.load(path)
    direct = CostModel.from_profile(profile)
    for tokens in (0, 1, 512, 1024, 4000, 8192, 20000, 32768, 100_000):
        assert loaded.recompute_ms(tokens) == direct.recompute_ms(tokens)
    for blocks in (0, 1, 10, 64, 500, 1024, 5000):
        assert loaded.swap_ms(blocks) == direct.swap_ms(blocks)
    assert loaded.recompute_ms(1024) == pytest.approx(41.0)  # median of the three
    assert loaded.swap_ms(64) == pytest.approx(6.0)
    assert loaded.source == str(path)


def test_profile_path_sanitises_odd_characters(tmp_path):
    """Slashes, colons and spaces become underscores; the file stays inside <cache>/profiles."""
    path = profile_path(tmp_path, "cuda:0 (H100)", "meta-llama/Llama-3.1-8B", "bfloat16")
    assert path.parent == tmp_path / "profiles"
    assert path.name == "cuda_0__H100_-meta-llama_Llama-3.1-8B-bfloat16.json"
    assert path.suffix == ".json"


def test_profile_path_cannot_escape_the_profiles_directory(tmp_path):
    """Path separators in any part cannot climb out of the profiles directory."""
    path = profile_path(tmp_path, "../..", "../../etc/passwd", "x/y")
    assert path.parent == tmp_path / "profiles"
    assert "/" not in path.name and "\\" not in path.name


def test_profile_saved_under_its_sanitised_path_loads(tmp_path):
    """Writing a profile at profile_path(...) and loading it back works end to end."""
    profile = _profile()
    path = profile_path(tmp_path, profile["device"], profile["model"], profile["dtype"])
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(profile))
    model = CostModel.load(path)
    assert model.swap_ms(64) == pytest.approx(6.0)
    assert model.source == str(path)


# --- a fit that can be trusted ----------------------------------------------------------

def test_a_profile_measured_under_contention_never_makes_a_long_prompt_free():
    # Measured on a loaded machine without warm-up: 16 tokens took longer than 128.
    fit = PiecewiseLinear.fit([(16, 2709.0), (128, 2188.0)])
    assert fit.adjusted
    values = [fit(x) for x in (0, 1, 16, 64, 128, 512, 4096, 32768)]
    assert all(v > 0 for v in values)
    assert values == sorted(values), "the fit decreased somewhere"
    assert fit(4096) > fit(128), "beyond the last size the cost keeps rising"


def test_a_clean_profile_is_kept_as_measured():
    fit = PiecewiseLinear.fit([(16, 40.0), (256, 120.0), (1024, 450.0)])
    assert not fit.adjusted
    assert fit(256) == 120.0 and fit(16) == 40.0
    assert fit(8) == 40.0                     # flat below the first size: never towards zero
    assert fit(2048) >= 450.0 + (450.0 - 120.0) / 768 * 1024 - 1e-9


def test_check_profile_names_a_profile_made_for_another_engine(tmp_path):
    profile = {"device": "cpu", "model": "other-model", "dtype": "bfloat16", "block_size": 16,
               "recompute_ms": [[16, 2709.0], [128, 2188.0]], "swap_ms": [[1, 0.1], [8, 0.5]]}
    problems = check_profile(profile, {"model": "SmolLM2", "dtype": "float32", "block_size": 16})
    assert any("model" in p for p in problems) and any("dtype" in p for p in problems)
    assert any("recompute_ms falls with size" in p for p in problems)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    warnings: list[str] = []
    model = CostModel.load_checked(path, {"model": "SmolLM2", "dtype": "float32", "block_size": 16}, warnings.append)
    assert model.source == "built-in" and warnings and "does not fit" in warnings[0]


def test_a_falling_profile_for_this_engine_is_used_refit_with_a_warning(tmp_path):
    profile = {"device": "cpu", "model": "m", "dtype": "float32", "block_size": 16,
               "recompute_ms": [[16, 2709.0], [128, 2188.0]], "swap_ms": [[1, 0.1], [8, 0.5]]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    warnings: list[str] = []
    model = CostModel.load_checked(path, {"model": "m", "dtype": "float32", "block_size": 16}, warnings.append)
    assert model.source == str(path) and len(warnings) == 1 and "falls with size" in warnings[0]
    assert model.recompute_ms(4096) > model.recompute_ms(128) > 0
