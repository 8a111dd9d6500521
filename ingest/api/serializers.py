from rest_framework import serializers

from ingest.models import Upload

# RFC 1123 host names (and the short names schedulers use); no slashes, no spaces.
HOSTNAME_RE = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})$"
JOB_RE = r"^[\w.:@+/=-]{1,255}$"


class UploadCreateSerializer(serializers.Serializer):
    file = serializers.FileField(allow_empty_file=True)
    host = serializers.RegexField(HOSTNAME_RE, max_length=253)
    job = serializers.RegexField(JOB_RE, max_length=255)
    attempt = serializers.IntegerField(required=False, default=0, min_value=0, max_value=100_000)
    rank = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=10_000_000
    )
    kind = serializers.ChoiceField(
        choices=[k for k in Upload.Kind.values if k != "unknown"], required=False, allow_blank=True
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
