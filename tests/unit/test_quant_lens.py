"""The quantisation lens: speedup measurements kept per model variant and load, the naive product
of int8's and speculation's speedups against the measured combination, and its drawing."""

from __future__ import annotations

import pytest

from engine_adapter.service.quant_lens import LensMachine, QuantLens
from engine_adapter.service.speedup_probe import SpeedSettings, SpeedupRow, SpeedupView
from explorer.views.lens_view import lens_figure, lens_key, lens_markdown

MACHINE = LensMachine(bandwidth_gbs=20.0, bytes_per_step=4_000_000_000)  # roofline 5 tokens/s per request


def probe(variant: str, load: int, plain: float, policy: float, ids=(("code", (1, 2, 3, 4)),)) -> SpeedupView:
    settings = SpeedSettings("a CPU, 2 cores", "bfloat16", "t / d", "draft", "auto table", load, "day", variant)
    rows = (SpeedupRow("code", policy / plain, policy / plain, policy / plain, 2, plain, policy),)
    return SpeedupView("done", 4, 4, None, "done", rows, settings, ids)


def test_a_finished_measurement_is_kept_once_per_variant_and_load():
    lens = QuantLens()
    view = probe("full", 0, 4.0, 8.0)
    point = lens.take(view, MACHINE)
    assert point is not None and point.roofline_tokens_per_s == pytest.approx(5.0)
    assert point.roofline_fraction == pytest.approx(0.8)
    assert lens.take(view, MACHINE) is None  # the same view again: nothing new
    assert lens.take(SpeedupView("running", 1, 4), MACHINE) is None  # not finished: not kept
    lens.take(probe("full", 0, 5.0, 9.0), MACHINE)  # a newer one at the same variant and load replaces it
    assert [(p.variant, p.load, p.plain_tokens_per_s) for p in lens.view("full", 0).points] == [("full", 0, 5.0)]


@pytest.mark.parametrize(
    "full, quantised, quant_gain, product, measured",
    [
        ((4.0, 8.0), (6.0, 9.0), 1.5, 3.0, 2.25),  # int8 1.5x, speculation 2x: product 3x, measured 2.25x
        ((4.0, 4.0), (8.0, 8.0), 2.0, 2.0, 2.0),  # speculation gives nothing: no overlap to see
    ],
)
def test_the_naive_product_against_the_measured_combination(full, quantised, quant_gain, product, measured):
    lens = QuantLens()
    lens.take(probe("full", 4, *full), MACHINE)
    lens.take(probe("int8-pair", 4, *quantised, ids=(("code", (1, 2, 9, 9)),)), LensMachine(20.0, 2_000_000_000))
    lens.take(probe("int8-target", 16, 3.0, 3.0), MACHINE)  # no full pair at load 16: no comparison
    view = lens.view("int8-pair", 4)
    assert [(p.variant, p.load) for p in view.points] == [("full", 4), ("int8-target", 16), ("int8-pair", 4)]
    (c,) = view.comparisons
    assert (c.variant, c.load) == ("int8-pair", 4)
    assert c.quant_gain == pytest.approx(quant_gain)
    assert c.spec_gain == pytest.approx(full[1] / full[0])
    assert c.product == pytest.approx(product) and c.measured == pytest.approx(measured)
    assert c.agreement == pytest.approx(0.5)  # two of the four greedy tokens the same
    text = lens_markdown(view)
    assert "int8 target and draft" in text and f"**{measured:.2f}x**" in text and "50.0%" in text
    assert f"multiplied {product:.2f}x, measured together {measured:.2f}x" in text
    figure = lens_figure(view)
    bars = ["quantisation alone", "speculation alone", "product", "measured together"]
    assert [bar.name for bar in figure.data] == bars
    assert list(figure.data[2].y) == [pytest.approx(product)]
    assert lens_key(view) != lens_key(QuantLens().view("full", 0))


def test_no_measurement_says_so():
    view = QuantLens().view("full", 0)
    assert "No measurement yet" in lens_markdown(view)
    assert "No comparison yet" in lens_figure(view).layout.title.text


def test_a_kind_with_an_outlying_rate_does_not_move_the_point():
    """A short answer's decode rate can read far off (two tokens close together): the median over kinds."""
    settings = SpeedSettings("a CPU, 2 cores", "bfloat16", "t / d", "draft", "auto table", 0, "day", "full")
    rows = tuple(
        SpeedupRow(kind, policy / plain, policy / plain, policy / plain, 1, plain, policy)
        for kind, plain, policy in (("code", 4.0, 8.0), ("math", 5.0, 9.0), ("qa", 400.0, 500.0))
    )
    point = QuantLens().take(SpeedupView("done", 6, 6, None, "done", rows, settings), MACHINE)
    assert (point.plain_tokens_per_s, point.policy_tokens_per_s, point.speedup) == (5.0, 9.0, 1.8)
