"""Template filters of the UI."""

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

register = template.Library()

_CODE_SPAN = re.compile(r"`([^`\n]{1,300})`")


@register.filter
def codespans(text) -> str:
    """A fix's `code spans` as <code>, everything escaped first (fixes quote log text and
    settings; nothing in them is markup)."""
    return mark_safe(_CODE_SPAN.sub(r"<code>\1</code>", escape(str(text or ""))))  # noqa: S308
