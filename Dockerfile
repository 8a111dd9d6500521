FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 FLEETWATCH_DATA_DIR=/data
WORKDIR /app
# WeasyPrint (the weekly report's PDF) needs pango and a font.
RUN apt-get update && apt-get install -y --no-install-recommends \
        libpango-1.0-0 libpangoft2-1.0-0 fonts-dejavu-core \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY fleet fleet
COPY ingest ingest
COPY analysis analysis
COPY agents agents
COPY manage.py ./
RUN pip install --no-cache-dir '.[server]' && mkdir -p /data
EXPOSE 8000
CMD ["gunicorn", "fleet.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "4"]
