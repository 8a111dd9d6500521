"""API-wide pieces: every error answers JSON with a ``detail`` saying what is wrong."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from rest_framework import status
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc, context):
    # Django's own request limits raise SuspiciousOperation subclasses that DRF leaves alone and
    # Django answers with an HTML page: an agent gets the same JSON detail as for any other error.
    if isinstance(exc, RequestDataTooBig):
        return Response(
            {
                "detail": "the form fields or JSON body are larger than the "
                f"{settings.DATA_UPLOAD_MAX_MEMORY_SIZE} byte limit"
            },
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, TooManyFieldsSent | TooManyFilesSent):
        what = "files" if isinstance(exc, TooManyFilesSent) else "form fields"
        return Response({"detail": f"too many {what} in one request"}, status=400)
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
