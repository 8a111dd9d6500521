"""The rule registry: every rule declares what it implicates and its basis, and the registry is
pinned to the ruleset version so that no rule changes meaning under an old version."""

import re

from analysis.classify.registry import ALL_RULES, BASIS, IMPLICATES, registry_hash
from analysis.classify.rules import RULESET_VERSION
from analysis.models import Incident

# One row per ruleset version: a change to any rule's culprit, strength, fix, needs, failure
# marking, implications or basis, or to a knowledge-base entry's culprit, signature, range or fix
# (from 2026.11.26.13), changes the hash, and needs a new version (and a re-run of
# `fleetwatch eval --split dev --calibrate`).
PINNED = {
    "2026.11.9": "3e139840f62b6274",
    "2026.11.10": "3e139840f62b6274",
    "2026.11.11": "09676a753053a5fd",
    "2026.11.12": "ca5c8f0c7f87a625",
    "2026.11.13": "ca5c8f0c7f87a625",
    "2026.11.25": "cbc8b5ce2a33090b",
    "2026.11.25.1": "cbc8b5ce2a33090b",
    "2026.11.25.2": "343225a719f118d1",
    "2026.11.25.3": "d366d473aa087e88",
    "2026.11.25.4": "d366d473aa087e88",
    "2026.11.25.5": "d366d473aa087e88",
    "2026.11.25.6": "d366d473aa087e88",
    "2026.11.25.7": "d366d473aa087e88",
    "2026.11.25.8": "d366d473aa087e88",
    "2026.11.25.9": "6058b14f0ab456db",
    "2026.11.25.10": "e2cc28f5d56c4304",
    "2026.11.25.11": "e2cc28f5d56c4304",
    "2026.11.26.1": "3a0d6c8419f6424e",
    "2026.11.26.2": "a4947112e3c1cdd4",
    "2026.11.26.3": "a4947112e3c1cdd4",
    "2026.11.26.4": "a4947112e3c1cdd4",
    "2026.11.26.5": "a4947112e3c1cdd4",
    "2026.11.26.6": "a4947112e3c1cdd4",
    "2026.11.26.7": "a4947112e3c1cdd4",
    "2026.11.26.8": "423ba8ee43c93051",
    "2026.11.26.9": "7310d62a7a96d5c8",
    "2026.11.26.10": "7310d62a7a96d5c8",
    "2026.11.26.11": "7310d62a7a96d5c8",
    "2026.11.26.12": "7310d62a7a96d5c8",
    # From .13 the hash covers the knowledge base's entries too.
    "2026.11.26.13": "cf16e661452a4df7",
    "2026.11.26.14": "185623f75f9e82d5",
    "2026.11.26.15": "902be32943b20fa3",
    "2026.11.26.16": "e08d9df576cafd98",
    "2026.11.26.17": "b139a83b22167e9e",
    "2026.11.26.18": "b139a83b22167e9e",
}

HOW = re.compile(
    r"^(hardware_hosts|network_hosts|socket_racks|stall_mounts|signature_hosts|suspect_hosts|"
    r"job_family|job_family_weak|versions|config:[a-z_]+(?:,[a-z_]+)*)$"
)


def test_every_rule_has_one_entry_in_the_registry_and_no_entry_names_a_rule_that_is_gone():
    ids = [rule.id for rule in ALL_RULES]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(IMPLICATES) == set(BASIS)


def test_every_implication_is_one_fleet_memory_knows_how_to_find():
    for rule_id, hows in IMPLICATES.items():
        for how in hows:
            assert HOW.match(how), (rule_id, how)


def test_every_rule_names_a_culprit_of_the_vocabulary_and_a_basis():
    for rule in ALL_RULES:
        assert rule.culprit in Incident.Culprit.values, rule.id
        assert len(BASIS[rule.id]) > 20, rule.id


def test_the_registry_is_pinned_to_the_ruleset_version():
    assert PINNED.get(RULESET_VERSION) == registry_hash(), (
        f"the registry changed: bump RULESET_VERSION and pin {registry_hash()} to it"
    )
