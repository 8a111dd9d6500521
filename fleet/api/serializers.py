from rest_framework import serializers

from fleet.models import Attempt, Host, Job


class HostSerializer(serializers.ModelSerializer):
    class Meta:
        model = Host
        fields = ["id", "hostname", "rack", "gpu_model", "first_seen", "last_seen"]


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = ["id", "number", "status", "started_at", "ended_at", "world_size"]


class AttemptReportSerializer(serializers.Serializer):
    """An attempt's start or end, from an agent or a scheduler's prolog/epilog."""

    job = serializers.RegexField(r"^[\w.:@+/=-]{1,255}$", max_length=255)
    attempt = serializers.IntegerField(required=False, default=0, min_value=0, max_value=100_000)
    event = serializers.ChoiceField(choices=["start", "end"])
    status = serializers.ChoiceField(
        choices=["succeeded", "failed", "unknown"], required=False, allow_blank=True
    )
    at = serializers.DateTimeField(required=False)
    host = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$", required=False)
    ranks = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=10_000_000),
        required=False,
        max_length=4096,
    )
    world_size = serializers.IntegerField(required=False, min_value=1, max_value=10_000_000)
    job_name = serializers.CharField(required=False, max_length=255, allow_blank=True)
    gpu_model = serializers.CharField(required=False, max_length=100, allow_blank=True)
    rack = serializers.CharField(required=False, max_length=100, allow_blank=True)
    config = serializers.DictField(
        child=serializers.CharField(max_length=500, allow_blank=True), required=False
    )
    versions = serializers.DictField(
        child=serializers.CharField(max_length=100, allow_blank=True), required=False
    )

    def validate(self, data):
        if data["event"] == "end" and not data.get("status"):
            raise serializers.ValidationError({"status": "an end report needs a status"})
        for field in ("config", "versions"):
            if len(data.get(field) or {}) > 200:
                raise serializers.ValidationError({field: "at most 200 keys"})
        return data


class AttemptReportedSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    job = serializers.CharField()
    attempt = serializers.IntegerField()
    status = serializers.CharField()


class JobSerializer(serializers.ModelSerializer):
    attempts = AttemptSerializer(many=True, read_only=True)

    class Meta:
        model = Job
        fields = ["id", "external_id", "name", "created_at", "attempts"]
