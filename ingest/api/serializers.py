from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ingest.models import Upload

# RFC 1123 host names (and the short names schedulers use); no slashes, no spaces.
HOSTNAME_RE = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})$"
JOB_RE = r"^[\w.:@+/=-]{1,255}$"
UPLOAD_KINDS = [k for k in Upload.Kind.values if k != "unknown"]


@extend_schema_field({"type": "string", "format": "binary"})
class ArtifactFileField(serializers.FileField):
    """The uploaded bytes. drf-spectacular documents a FileField by its read form (a URL), which
    told clients, and the API fuzzer, to send the file as a text field; it is a file part."""


class UploadCreateSerializer(serializers.Serializer):
    file = ArtifactFileField(allow_empty_file=True)
    host = serializers.RegexField(HOSTNAME_RE, max_length=253)
    job = serializers.RegexField(JOB_RE, max_length=255)
    attempt = serializers.IntegerField(required=False, default=0, min_value=0, max_value=100_000)
    rank = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=10_000_000
    )
    kind = serializers.ChoiceField(
        choices=UPLOAD_KINDS,
        required=False,
        allow_blank=True,
        # DRF's message quotes the value back, whatever its size: name the choices instead.
        error_messages={"invalid_choice": f"not one of {', '.join(UPLOAD_KINDS)}"},
    )


class UploadAcceptedSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.CharField()
    duplicate = serializers.BooleanField()


class UploadSerializer(serializers.ModelSerializer):
    host = serializers.SlugRelatedField(slug_field="hostname", read_only=True)
    job = serializers.SlugRelatedField(slug_field="external_id", read_only=True)
    attempt = serializers.IntegerField(source="attempt.number", read_only=True)

    class Meta:
        model = Upload
        fields = [
            "id",
            "sha256",
            "kind",
            "size",
            "compressed",
            "filename",
            "host",
            "job",
            "attempt",
            "rank",
            "status",
            "error",
            "received_at",
            "parsed_at",
            "line_count",
            "event_count",
        ]


class ArtifactRequestSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    job = serializers.CharField(source="job.external_id")
    attempt = serializers.IntegerField(source="attempt.number")
    rank = serializers.IntegerField(allow_null=True)
    kind = serializers.CharField()
    reason = serializers.CharField()
    filename = serializers.CharField(
        source="source_file", help_text="the summary the server read; send the trace behind it"
    )
    window_start = serializers.DateTimeField(source="attempt.started_at", allow_null=True)
    window_end = serializers.DateTimeField(source="attempt.ended_at", allow_null=True)


class ArtifactRequestAnswerSerializer(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=["sent", "none"])
