from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from ingest.api.serializers import (
    ArtifactRequestAnswerSerializer,
    ArtifactRequestSerializer,
    UploadAcceptedSerializer,
    UploadCreateSerializer,
    UploadSerializer,
)
from ingest.auth import CanRead, CanUpload
from ingest.filtersets import UploadFilterSet
from ingest.models import ArtifactRequest, Upload
from ingest.services import UploadRejected, upload_receive

# Room for the multipart envelope and form fields around the file itself.
MULTIPART_OVERHEAD = 64 * 1024


class UploadViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Uploaded artifacts: agents POST them (``upload`` scope); readers list them."""

    queryset = Upload.objects.select_related("host", "job", "attempt")
    serializer_class = UploadSerializer
    filterset_class = UploadFilterSet
    parser_classes = [MultiPartParser]

    def get_permissions(self):
        return [CanUpload()] if self.action == "create" else [CanRead()]

    @extend_schema(
        request={"multipart/form-data": UploadCreateSerializer},
        responses={
            202: UploadAcceptedSerializer,
            400: OpenApiResponse(description="invalid fields or unreadable file"),
            401: OpenApiResponse(description="no key or an unknown key"),
            403: OpenApiResponse(description="the key lacks the upload scope"),
            413: OpenApiResponse(description="file larger than the limit"),
            507: OpenApiResponse(
                description="artifact storage is full: nothing was stored; send it again later"
            ),
        },
    )
    def create(self, request):
        """Accept one artifact. Idempotent: the same bytes for the same host and job answer
        with the id of the first upload."""
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > settings.FLEETWATCH_MAX_UPLOAD_BYTES + (
            MULTIPART_OVERHEAD
        ):
            # Refuse before reading a byte of the body.
            return Response(
                {
                    "detail": f"request body of {length} bytes is larger than the "
                    f"{settings.FLEETWATCH_MAX_UPLOAD_BYTES} byte limit"
                },
                status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            )
        form = UploadCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        fields = form.validated_data
        try:
            received = upload_receive(
                fileobj=fields["file"],
                filename=fields["file"].name or "",
                hostname=fields["host"],
                job_id=fields["job"],
                attempt_number=fields.get("attempt") or 0,
                rank=fields.get("rank"),
                kind=fields.get("kind") or "",
                key=request.auth,
            )
        except UploadRejected as exc:
            response = Response({"detail": str(exc)}, status=exc.status)
            if exc.status == 507:
                # The agent keeps the file and comes back (agents/uploader.py honours it).
                response["Retry-After"] = str(settings.FLEETWATCH_RETRY_AFTER_SECONDS)
            return response
        upload = received.upload
        return Response(
            {"id": upload.pk, "status": upload.status, "duplicate": not received.created},
            status=status.HTTP_202_ACCEPTED,
        )


class ArtifactRequestsView(APIView):
    """What the server wants a host's agent to send: raw traces of suspect ranks."""

    permission_classes = [CanUpload]

    @extend_schema(
        parameters=[OpenApiParameter("host", str, required=True)],
        responses={200: ArtifactRequestSerializer(many=True)},
    )
    def get(self, request):
        host = request.query_params.get("host", "")
        if not host:
            return Response({"detail": "the host query parameter is required"}, status=400)
        open_requests = (
            ArtifactRequest.objects.filter(host__hostname=host, fulfilled_at=None, outcome="")
            .select_related("job", "attempt")
            .order_by("created_at")[:100]
        )
        return Response(ArtifactRequestSerializer(open_requests, many=True).data)


class ArtifactRequestAnswerView(APIView):
    """The agent answers a request once: ``sent`` (the file is on its way) or ``none``."""

    permission_classes = [CanUpload]

    @extend_schema(request=ArtifactRequestAnswerSerializer, responses={200: None, 404: None})
    def post(self, request, pk: int):
        from ingest.services import artifact_request_answer

        body = ArtifactRequestAnswerSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if not ArtifactRequest.objects.filter(pk=pk).exists():
            return Response({"detail": "no such request"}, status=404)
        closed = artifact_request_answer(pk, body.validated_data["outcome"])
        return Response({"id": pk, "closed_now": closed})
