"""The simulator's evaluation: "flagged after how many of its incidents" counts the planted
culprit's own failures, whatever else the flagged entity was implicated in."""

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from fleet.simulate import evaluate

T0 = datetime(2026, 11, 16, tzinfo=UTC)


def score(kind_key: str, flagged_after_hours: float, incidents_when_flagged: int):
    kind, key = kind_key.split(":", 1)
    return SimpleNamespace(
        entity=SimpleNamespace(kind=kind, key=key),
        flagged=True,
        culprit="dataloader_cpu",
        first_flagged_at=T0 + timedelta(hours=flagged_after_hours),
        incidents_when_flagged=incidents_when_flagged,
        explanation="",
    )


def truth(failed_after_hours: list[float]) -> dict:
    return {
        "plants": [
            {
                "id": "loader_on_a100",
                "kind": "data loader oversubscribes CPUs on A100 hosts",
                "culprit": "dataloader_cpu",
                "entities": ["config:num_workers=16", "config:num_workers=16 on A100"],
                "incidents": len(failed_after_hours),
                "failed_at": [(T0 + timedelta(hours=h)).isoformat() for h in failed_after_hours],
            }
        ]
    }


def test_an_entity_implicated_by_a_noise_failure_too_counts_only_the_plants_failures():
    # Flagged at hour 12 with 4 implicating incidents, one of them a noise failure of the same
    # job family: the plant had failed 3 times by then.
    result = evaluate(truth([10.5, 11.2, 11.9, 30.0]), [score("config:num_workers=16", 12, 4)])
    (plant,) = result["plants"]
    assert plant["flagged"] and plant["after_incidents"] == 3


def test_the_earliest_flagged_entity_of_a_plant_is_the_one_counted():
    scores = [
        score("config:num_workers=16", 14, 5),
        score("config:num_workers=16 on A100", 11, 2),
    ]
    (plant,) = evaluate(truth([10.0, 10.5, 13.0]), scores)["plants"]
    assert plant["after_incidents"] == 2
    assert plant["flagged_as"] == ["config:num_workers=16", "config:num_workers=16 on A100"]
