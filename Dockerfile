FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 FLEETWATCH_DATA_DIR=/data
WORKDIR /app
COPY pyproject.toml README.md ./
COPY fleet fleet
COPY ingest ingest
COPY analysis analysis
COPY agents agents
COPY manage.py ./
RUN pip install --no-cache-dir '.[server]' && mkdir -p /data
EXPOSE 8000
CMD ["gunicorn", "fleet.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "4"]
