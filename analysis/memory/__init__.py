"""Fleet memory: link each incident to the entities its verdict implicates, record what every
attempt ran on, and score entities whose implications recur more than chance allows.

One module per subject, over one vocabulary of entities: ``entities`` (what an incident
implicates and what an attempt ran on), ``correlate`` (recurrence scores across the fleet),
``contrast`` (settings that fail on one GPU model), ``culprits`` (notifications and
regressions of culprits as units of work) and ``health`` (a host's verdict, and repairs). The
statistics themselves are pure (analysis.classify.recurrence). Callers use the names below.
"""

from analysis.classify.recurrence import FLAG_SCORE

from .contrast import Contrast, config_contrast, config_contrast_record
from .correlate import fleet_correlate
from .culprits import culprits_notify_flagged, culprits_regress
from .entities import (
    CONTRAST_KEYS,
    attempt_entities,
    exposures_record,
    incident_fingerprint,
    incident_implicate,
    window_days,
)
from .health import DRAIN_SCORE, HostHealth, host_health, host_repaired, hosts_health_of

__all__ = [
    "CONTRAST_KEYS",
    "DRAIN_SCORE",
    "FLAG_SCORE",
    "Contrast",
    "HostHealth",
    "attempt_entities",
    "config_contrast",
    "config_contrast_record",
    "culprits_notify_flagged",
    "culprits_regress",
    "exposures_record",
    "fleet_correlate",
    "host_health",
    "host_repaired",
    "hosts_health_of",
    "incident_fingerprint",
    "incident_implicate",
    "window_days",
]
