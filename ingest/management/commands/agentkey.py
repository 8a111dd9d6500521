"""``manage.py agentkey create NAME --scopes upload,read`` and friends."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from ingest.models import AgentKey, Scope


def parse_scopes(raw: str) -> list[str]:
    scopes = [s.strip() for s in raw.split(",") if s.strip()]
    unknown = sorted(set(scopes) - set(Scope.values))
    if unknown or not scopes:
        raise CommandError(
            f"unknown scope(s) {', '.join(unknown) or '(none given)'}; choose from "
            f"{', '.join(Scope.values)}"
        )
    return sorted(set(scopes))


class Command(BaseCommand):
    help = "Create, list and revoke API keys for agents, schedulers and operators."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key; it is printed once, last")
        create.add_argument("name")
        create.add_argument(
            "--scopes", default="upload", help="comma-separated: upload,read,operate"
        )
        sub.add_parser("list", help="list keys (never their secret)")
        revoke = sub.add_parser("revoke", help="revoke a key by its prefix")
        revoke.add_argument("prefix")

    def handle(self, *args, action: str, **options):
        if action == "create":
            name = options["name"].strip()
            if not name or len(name) > 50:
                raise CommandError("NAME must be 1 to 50 characters")
            scopes = parse_scopes(options["scopes"])
            key_row, key = AgentKey.objects.create_key(name=name, scopes=scopes)
            self.stdout.write(
                f"Created key {key_row.prefix} '{name}' with scopes {','.join(scopes)}. "
                "This is the only time it is shown:"
            )
            self.stdout.write(key)
        elif action == "list":
            for row in AgentKey.objects.order_by("created"):
                state = "revoked" if row.revoked else "active"
                self.stdout.write(
                    f"{row.prefix}\t{row.name}\t{','.join(row.scopes)}\t{state}\t"
                    f"last used {row.last_used_at or 'never'}"
                )
        elif action == "revoke":
            updated = AgentKey.objects.filter(prefix=options["prefix"], revoked=False).update(
                revoked=True
            )
            if not updated:
                raise CommandError(f"no active key with prefix {options['prefix']!r}")
            self.stdout.write(f"Revoked {options['prefix']}")
