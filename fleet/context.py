"""Template context every page gets: the culprit palette (analysis/palette.py), so that badges
and charts in the UI take their colours from the one place the weekly report takes them."""

from analysis.palette import CULPRIT_COLOURS, badge_background


def culprit_palette(request) -> dict:
    return {
        "culprit_colours": CULPRIT_COLOURS,
        "culprit_badges": {c: badge_background(colour) for c, colour in CULPRIT_COLOURS.items()},
    }
