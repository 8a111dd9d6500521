"""Pure parsers: bytes in, typed events out. No Django here (tests/test_layering.py)."""

from .artifact import parse_artifact, parse_file, parse_files, register_kind, sniff
from .log import LogParse, ParseIssue, parse_log

__all__ = [
    "LogParse",
    "ParseIssue",
    "parse_artifact",
    "parse_file",
    "parse_files",
    "parse_log",
    "register_kind",
    "sniff",
]
