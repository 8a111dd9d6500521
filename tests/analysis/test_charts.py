"""The one chart renderer (analysis/charts.py): what the UI and the weekly report draw."""

import re

from analysis import charts
from analysis.palette import CULPRIT_COLOURS


def segments(svg: str) -> list[tuple[str, str]]:
    return re.findall(r'fill="(#[0-9a-f]{6})" data-culprit="([a-z_]+)"', svg)


def test_each_nonzero_count_is_one_segment_in_its_class_colour_under_its_total():
    svg = charts.stacked_columns(
        ["11-24", "11-25"],
        {"storage_io": [2, 0], "unknown": [1, 3]},
        aria="Incidents per day",
    )
    assert sorted(segments(svg)) == sorted(
        [
            (CULPRIT_COLOURS["storage_io"], "storage_io"),
            (CULPRIT_COLOURS["unknown"], "unknown"),
            (CULPRIT_COLOURS["unknown"], "unknown"),
        ]
    )
    assert "<title>11-24 · storage_io: 2</title>" in svg
    assert re.findall(r'font-size="10">(\d*)</text>', svg) == ["3", "3"]  # each day's total
    assert svg.count('width="10" height="10"') == 2  # a legend: two classes drawn


def test_nothing_to_draw_says_so_and_text_is_escaped():
    assert charts.stacked_columns(["a"], {"unknown": [0]}, aria="x", empty="None <here>") == (
        '<p class="empty">None &lt;here&gt;</p>'
    )
    svg = charts.stacked_columns(["<b>"], {"unknown": [1]}, aria='"quoted"')
    assert "<b>" not in svg and "&lt;b&gt;" in svg and 'aria-label="&quot;quoted&quot;"' in svg
    assert 'width="10" height="10"' not in svg  # one class: no legend


def test_bars_by_culprit_longest_first_zeros_left_out():
    svg = charts.bars_by_culprit({"oom_or_crash": 1, "storage_io": 4, "unknown": 0}, aria="x")
    assert [c for _, c in segments(svg)] == ["storage_io", "oom_or_crash"]
