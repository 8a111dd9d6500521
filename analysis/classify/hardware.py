"""Rules that read hardware and host stats uploaded by the agent (NVML, disk, CPU, memory)."""

from __future__ import annotations

from .rules import Rule

HARDWARE_RULES: tuple[Rule, ...] = ()
