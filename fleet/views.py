"""The web UI shell: server-rendered pages; every log text goes through autoescaping."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import render

from analysis import selectors
from analysis.models import Incident


@login_required
def incident_list(request):
    filters = {
        "culprit": request.GET.get("culprit", ""),
        "status": request.GET.get("status", ""),
        "job": request.GET.get("job", ""),
        "host": request.GET.get("host", ""),
    }
    page = Paginator(selectors.incident_list(**filters), 50).get_page(request.GET.get("page"))
    return render(
        request,
        "fleet/incident_list.html",
        {
            "page": page,
            "filters": filters,
            "culprits": Incident.Culprit.values,
            "statuses": Incident.Status.values,
        },
    )


@login_required
def incident_detail(request, pk: int):
    try:
        incident = selectors.incident_get(pk)
    except Incident.DoesNotExist:
        raise Http404("No such incident") from None
    return render(request, "fleet/incident_detail.html", {"incident": incident})
