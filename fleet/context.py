"""Template context every page gets: the culprit palette (analysis/palette.py), so that badges
and charts in the UI take their colours from the one place the weekly report takes them."""

from analysis.palette import CULPRIT_BADGES, CULPRIT_COLOURS


def culprit_palette(request) -> dict:
    return {"culprit_colours": CULPRIT_COLOURS, "culprit_badges": CULPRIT_BADGES}
