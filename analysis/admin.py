from django.contrib import admin

from analysis.models import Incident


@admin.register(Incident)
class IncidentAdmin(admin.ModelAdmin):
    list_display = ["id", "job", "culprit", "confidence", "status", "opened_at"]
    list_filter = ["culprit", "status"]
