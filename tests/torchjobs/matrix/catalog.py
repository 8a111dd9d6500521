"""The faults of the matrix and the rank each is planted on by default (no torch import here:
the harness reads it too). Ranks 0-1 run on host-a, 2-3 on host-b."""

FAULTS = (
    "healthy",
    "sleep_before_collective",
    "unseeded_split",
    "collective_mismatch",
    "slow_mount",
    "rank_raises",
    "rank_sigkilled",
    "loader_starved_start",
    "loader_starved_midrun",
)
# slow_mount is rank 0's by definition; unseeded_split is every rank's; healthy has none.
DEFAULT_PLANTED = {
    "healthy": None,
    "sleep_before_collective": 2,
    "unseeded_split": None,
    "collective_mismatch": 1,
    "slow_mount": 0,
    "rank_raises": 3,
    "rank_sigkilled": 1,
    "loader_starved_start": 2,
    "loader_starved_midrun": 3,
}
