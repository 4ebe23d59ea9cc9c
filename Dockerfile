# The Vigil server image (API, and later the Celery worker and beat). No torch: the
# server never imports it.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY collector collector
COPY backend backend
COPY detectors detectors
COPY frontend frontend
COPY migrations migrations
COPY examples examples
RUN pip install --no-cache-dir '.[server]'
EXPOSE 8000
CMD ["vigil", "server", "--host", "0.0.0.0"]
