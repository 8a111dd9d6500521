from rest_framework import serializers

from analysis.models import Incident


class IncidentSerializer(serializers.ModelSerializer):
    job = serializers.SlugRelatedField(slug_field="external_id", read_only=True)
    attempt = serializers.IntegerField(source="attempt.number", read_only=True)
    hosts = serializers.SerializerMethodField()

    class Meta:
        model = Incident
        fields = [
            "id",
            "job",
            "attempt",
            "status",
            "culprit",
            "confidence",
            "summary",
            "fix",
            "suspects",
            "evidence",
            "alternatives",
            "rule_ids",
            "ruleset_version",
            "hosts",
            "opened_at",
            "classified_at",
        ]

    def get_hosts(self, incident) -> list[str]:
        return sorted({u.host.hostname for u in incident.attempt.uploads.all()})
