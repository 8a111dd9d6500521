import re

from rest_framework import serializers

from fleet.models import Attempt, Host, Job

# A config or version key: NCCL_IB_HCA, torch, dataloader.num_workers (printable, no NUL).
CONFIG_KEY_RE = re.compile(r"[^\x00-\x1f\x7f\ud800-\udfff]{1,100}")


class HostSerializer(serializers.ModelSerializer):
    class Meta:
        model = Host
        fields = ["id", "hostname", "rack", "gpu_model", "first_seen", "last_seen"]


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = [
            "id",
            "number",
            "status",
            "started_at",
            "ended_at",
            "world_size",
            "classify_error",
        ]


class AttemptReportSerializer(serializers.Serializer):
    """An attempt's start or end, from an agent or a scheduler's prolog/epilog."""

    job = serializers.RegexField(r"^[\w.:@+/=-]{1,255}$", max_length=255)
    attempt = serializers.IntegerField(required=False, default=0, min_value=0, max_value=100_000)
    # DRF's invalid_choice message quotes the value back, whatever its size: name the choices.
    event = serializers.ChoiceField(
        choices=["start", "end"], error_messages={"invalid_choice": "not one of start, end"}
    )
    status = serializers.ChoiceField(
        choices=["succeeded", "failed", "unknown"],
        required=False,
        allow_blank=True,
        error_messages={"invalid_choice": "not one of succeeded, failed, unknown"},
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
            # DictField checks values only. A key is a setting's name: it is stored (JSON) and
            # shown, so it is held to what the values are: bounded, no NUL (PostgreSQL refuses
            # it), no lone surrogate (no UTF-8 encoder takes one).
            for key in data.get(field) or {}:
                if not CONFIG_KEY_RE.fullmatch(key):
                    raise serializers.ValidationError(
                        {field: f"key {key[:40]!r}: a key is 1 to 100 printable characters"}
                    )
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
