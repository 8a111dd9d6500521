from rest_framework import serializers

from fleet.models import Attempt, Host, Job


class HostSerializer(serializers.ModelSerializer):
    class Meta:
        model = Host
        fields = ["id", "hostname", "rack", "gpu_model", "first_seen", "last_seen"]


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = ["id", "number", "status", "started_at", "ended_at"]


class JobSerializer(serializers.ModelSerializer):
    attempts = AttemptSerializer(many=True, read_only=True)

    class Meta:
        model = Job
        fields = ["id", "external_id", "name", "created_at", "attempts"]
