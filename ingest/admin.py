from django.contrib import admin
from rest_framework_api_key.admin import APIKeyModelAdmin

from ingest.models import AgentKey, Upload


@admin.register(AgentKey)
class AgentKeyAdmin(APIKeyModelAdmin):
    list_display = [*APIKeyModelAdmin.list_display, "scopes", "last_used_at"]


@admin.register(Upload)
class UploadAdmin(admin.ModelAdmin):
    list_display = ["id", "kind", "host", "job", "rank", "status", "received_at"]
    list_filter = ["status", "kind"]
    readonly_fields = ["sha256", "size", "blob"]
