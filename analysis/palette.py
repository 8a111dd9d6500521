"""One colour per culprit class, wherever Fleetwatch draws one: the UI's chart and badges (the
page receives them, fleet/context.py) and the weekly report's charts, HTML and PDF. Pure."""

from analysis.classify import CULPRITS

CULPRIT_COLOURS: dict[str, str] = {
    "bad_node_hardware": "#dc2626",
    "network_transport": "#f59e0b",
    "storage_io": "#a16207",
    "dataloader_cpu": "#7c3aed",
    "rank_desync_code": "#0284c7",
    "parallelism_config": "#0d9488",
    "oom_or_crash": "#be185d",
    "timeout_too_short": "#65a30d",
    "software_version": "#4f46e5",
    "unknown": "#94a3b8",
}
assert set(CULPRIT_COLOURS) == set(CULPRITS), "every culprit class has its colour"


def badge_background(colour: str, share: float = 0.16) -> str:
    """The colour mixed into white (a badge's background, text stays dark): ``#rrggbb``."""
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - (255 - c) * share):02x}" for c in rgb)


# Each class's badge background, mixed once.
CULPRIT_BADGES: dict[str, str] = {c: badge_background(col) for c, col in CULPRIT_COLOURS.items()}
