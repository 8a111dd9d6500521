from rest_framework import serializers

from analysis.models import Incident, IncidentRevision


class IncidentRevisionSerializer(serializers.ModelSerializer):
    class Meta:
        model = IncidentRevision
        fields = ["at", "culprit", "confidence", "ranks", "rule_id", "cause", "ruleset_version"]


class IncidentSerializer(serializers.ModelSerializer):
    job = serializers.SlugRelatedField(slug_field="external_id", read_only=True)
    attempt = serializers.IntegerField(source="attempt.number", read_only=True)
    hosts = serializers.SerializerMethodField()
    occurrence = serializers.SerializerMethodField()
    revisions = IncidentRevisionSerializer(
        many=True, read_only=True, help_text="each verdict the incident had, oldest first"
    )

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
            "fingerprint",
            "occurrence",
            "opened_at",
            "classified_at",
            "revisions",
            "similar",
            "assignee",
            "snoozed_until",
            "acknowledged_at",
            "acknowledged_by",
            "resolved_at",
            "resolved_by",
            "journal",
        ]

    def get_occurrence(self, incident) -> int:
        """How many incidents so far share this one's cause ("the 7th time")."""
        counts = self.context.get("fingerprint_counts")
        if counts is not None and incident.fingerprint:
            # In lists: how many incidents share the cause in all (one query per page).
            return counts.get(incident.fingerprint, 1)
        return (
            Incident.objects.filter(
                fingerprint=incident.fingerprint, opened_at__lte=incident.opened_at
            ).count()
            if incident.fingerprint
            else 1
        )

    def get_hosts(self, incident) -> list[str]:
        return sorted({u.host.hostname for u in incident.attempt.uploads.all()})


class HostHealthSerializer(serializers.Serializer):
    hostname = serializers.CharField()
    verdict = serializers.ChoiceField(choices=["ok", "watch", "drain"])
    score = serializers.FloatField()
    reasons = serializers.ListField(child=serializers.CharField())
    incidents = serializers.ListField(child=serializers.IntegerField())
    since = serializers.DateTimeField(allow_null=True)


class HostRepairSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class CulpritScoreSerializer(serializers.ModelSerializer):
    kind = serializers.CharField(source="entity.kind")
    key = serializers.CharField(source="entity.key")

    class Meta:
        from analysis.models import CulpritScore

        model = CulpritScore
        fields = [
            "id",
            "kind",
            "key",
            "culprit",
            "score",
            "flagged",
            "implicated",
            "exposed",
            "baseline",
            "explanation",
            "incidents",
            "first_flagged_at",
            "incidents_when_flagged",
            "attempts",
            "computed_at",
            "status",
            "assignee",
            "snoozed_until",
            "acknowledged_at",
            "acknowledged_by",
            "resolved_at",
            "resolved_by",
            "regressed_at",
            "journal",
        ]


class WorkflowSerializer(serializers.Serializer):
    """The body of a workflow step: a note for the audit journal, and what the step needs."""

    note = serializers.CharField(required=False, allow_blank=True, max_length=2000)
    until = serializers.DateTimeField(
        required=False, allow_null=True, help_text="snooze: until when (null: unsnooze)"
    )


class AssignSerializer(serializers.Serializer):
    """The body of ``assign``: who takes it, and a note for the journal."""

    note = serializers.CharField(required=False, allow_blank=True, max_length=2000)
    assignee = serializers.CharField(
        allow_blank=True,
        max_length=150,
        help_text="a user name or a team ('team:storage'); blank takes it from everyone",
    )
