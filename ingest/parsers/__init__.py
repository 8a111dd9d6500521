"""Pure parsers: bytes in, typed events out. No Django here (tests/test_layering.py)."""

from .log import LogParse, ParseIssue, parse_log

__all__ = ["LogParse", "ParseIssue", "parse_log"]
