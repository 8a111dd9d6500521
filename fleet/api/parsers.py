"""Request body parsers. A module of its own, importing no DRF views: ``DEFAULT_PARSER_CLASSES``
is resolved while ``rest_framework.views`` is being imported (see ``throttling``)."""

from __future__ import annotations

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, but a body nested deeper than the decoder's recursion limit (a 2 MB
    body holds a million ``[``) is a 400 that says so, not a RecursionError and a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply") from None
