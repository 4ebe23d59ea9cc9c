"""Every table, imported in one place so ``Base.metadata`` is complete (Alembic uses it)."""

from backend.actions.models import Action
from backend.alerts.models import DeliveryIncident, Silence, WebhookDelivery, WebhookReceiver
from backend.audit.models import AuditEntry
from backend.auth.models import ApiToken
from backend.db import Base
from backend.incidents.models import Incident
from backend.ingest.models import IngestBatch
from backend.jobs.models import Job, Rank, Run
from backend.recovery.models import RecoveryPolicy
from backend.slos.models import Slo, SloMinute
from backend.swap.models import ShapeFingerprint, SwapPolicy
from backend.telemetry.models import (
    CollectiveRecord,
    CollectiveRollup,
    JobEvent,
    MetricPoint,
    OpSequence,
    ServingMinute,
    ServingRequest,
    StepRecord,
    StepRollup,
)

__all__ = [
    "Action",
    "ApiToken",
    "AuditEntry",
    "Base",
    "CollectiveRecord",
    "CollectiveRollup",
    "DeliveryIncident",
    "Incident",
    "IngestBatch",
    "Job",
    "JobEvent",
    "MetricPoint",
    "OpSequence",
    "Rank",
    "RecoveryPolicy",
    "Run",
    "ServingMinute",
    "ServingRequest",
    "ShapeFingerprint",
    "Silence",
    "Slo",
    "SloMinute",
    "StepRecord",
    "StepRollup",
    "SwapPolicy",
    "WebhookDelivery",
    "WebhookReceiver",
]
