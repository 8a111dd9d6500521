"""OpenAPI: describe agent keys as HTTP bearer authentication."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class AgentKeyScheme(OpenApiAuthenticationExtension):
    target_class = "ingest.auth.AgentKeyAuthentication"
    name = "agentKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An agent key from `manage.py agentkey create NAME --scopes …`.",
        }
