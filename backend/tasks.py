"""Every Celery task, imported in one place so a worker registers them all."""

from backend.actions.tasks import expire_actions
from backend.alerts.tasks import remind_open_incidents, send_due_notifications, send_notification
from backend.detection.tasks import detect_job, sweep
from backend.jobs.tasks import retention
from backend.telemetry.retention import raw_retention

__all__ = [
    "detect_job",
    "expire_actions",
    "raw_retention",
    "remind_open_incidents",
    "retention",
    "send_due_notifications",
    "send_notification",
    "sweep",
]
