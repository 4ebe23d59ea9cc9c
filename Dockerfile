# The Vigil server image: API, Celery worker, beat and `vigil migrate` (docker-compose.yml
# builds it once, as `vigil:latest`, and runs each of them from it). No torch: the server
# never imports it.
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
# Run unprivileged. The code stays root-owned (read-only to the server); /data is the one
# place it writes: an embedded server's SQLite file and its key (`docker run -v …:/data`).
RUN useradd --system --uid 10001 --user-group --home-dir /data --create-home vigil
WORKDIR /data
USER vigil:vigil
EXPOSE 8000
CMD ["vigil", "server", "--host", "0.0.0.0"]
