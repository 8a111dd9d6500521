"""API-wide pieces: every error answers JSON with a ``detail`` saying what is wrong."""

from __future__ import annotations

from rest_framework.pagination import PageNumberPagination
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "detail" not in response.data:
        # Field validation errors: keep the per-field messages and add one sentence.
        fields = ", ".join(sorted(response.data))
        response.data = {"detail": f"Invalid fields: {fields}.", "errors": response.data}
    elif response is not None and isinstance(response.data, list):
        response.data = {"detail": " ".join(str(x) for x in response.data)}
    return response


class Pagination(PageNumberPagination):
    """``{"count", "next", "previous", "results"}``; clients may ask for up to 500 a page."""

    page_size_query_param = "page_size"
    max_page_size = 500
