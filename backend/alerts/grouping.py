"""Grouping notifications, as Alertmanager does: a job's burst is one notification.

    deliveries = enqueue(session, [(receiver, incident, "llama-8b", "firing"), …],
                         now=now, public_url=settings.public_url)

Each (receiver, incident, status) goes into a *group*: the receiver's ``group_by`` labels
(``alertname``, ``job``, ``kind``, ``severity``, ``incident_id``) and the status pick it.

- Incidents enqueued together that share a group are one delivery.
- A new group's delivery waits ``group_wait_s`` (the receiver's; Alertmanager's
  ``group_wait``; none when ``group_by`` has ``incident_id``: nothing would join) before
  it is due; incidents of the same group enqueued meanwhile (the
  next detection runs) join it and its payload is rebuilt. Once the wait is over or a
  sender has claimed it, the payload is frozen and a later incident starts a new group.
- A group holds at most ``MAX_GROUP`` incidents; more start another delivery.
- An incident already waiting in the group is not added twice, unless a delivery of the
  other status for it was made since (it resolved and fired again within the wait): then
  it gets a new delivery, so a receiver never sees "resolved" last for an open incident.

Resolved notifications are grouped the same way (their own groups). The payload of a
group comes from ``backend.alerts.group_formats``. Services only flush.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.alerts import formats
from backend.alerts.group_formats import Member, build_group
from backend.alerts.models import DeliveryIncident, WebhookDelivery, WebhookReceiver
from backend.incidents.models import Incident
from backend.jobs.models import Job

MAX_GROUP = 50

Item = tuple[WebhookReceiver, Incident, str, str]  # receiver, incident, job name, status


def group_labels(receiver: WebhookReceiver, incident: Incident, job: str) -> dict[str, str]:
    """The incident's values of the receiver's ``group_by`` labels."""
    labels = formats.alert_labels(incident, job)
    return {k: labels[k] for k in receiver.group_by if k in labels}


def group_key(status: str, labels: dict[str, str]) -> str:
    """A fixed-width key for the group (status and label values)."""
    canonical = json.dumps([status, sorted(labels.items())], separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class _Bucket:
    """The incidents of one group, from one ``enqueue`` call."""

    def __init__(self, receiver: WebhookReceiver, status: str, labels: dict[str, str]) -> None:
        self.receiver, self.status, self.labels = receiver, status, labels
        self.members: dict[int, Member] = {}


def enqueue(
    session: Session,
    items: Iterable[Item],
    *,
    now: datetime,
    public_url: str,
    wait_s: int | None = None,
) -> list[WebhookDelivery]:
    """Put each item into its group's delivery; returns the deliveries made or joined.

    ``wait_s`` overrides the receivers' ``group_wait_s`` for new groups (0: due now)."""
    buckets: dict[tuple[int, str], _Bucket] = {}
    for receiver, incident, job, status in items:
        labels = group_labels(receiver, incident, job)
        key = group_key(status, labels)
        bucket = buckets.setdefault((receiver.id, key), _Bucket(receiver, status, labels))
        bucket.members.setdefault(incident.id, (incident, job))
    out: list[WebhookDelivery] = []
    # One order for every transaction: waiting groups are locked, so no two lock in turn.
    for (_, key), bucket in sorted(buckets.items(), key=lambda kv: kv[0]):
        members = sorted(bucket.members.values(), key=lambda m: m[0].id)
        out.extend(_place(session, bucket, key, members, now, public_url, wait_s))
    session.flush()
    return out


def _place(
    session: Session,
    bucket: _Bucket,
    key: str,
    members: list[Member],
    now: datetime,
    public_url: str,
    wait_s: int | None,
) -> list[WebhookDelivery]:
    out: list[WebhookDelivery] = []
    waiting = _waiting(session, bucket.receiver.id, key, now)
    if waiting is not None:
        existing = group_members(session, waiting.id)
        inside = {row.id for row, _ in existing}
        again = _resent_since(session, waiting, [m[0].id for m in members if m[0].id in inside])
        fresh = [m for m in members if m[0].id not in inside]
        room = max(MAX_GROUP - len(existing), 0)
        if fresh[:room]:
            _fill(session, waiting, bucket, existing + fresh[:room], now, public_url)
            _link(session, waiting, fresh[:room])
            out.append(waiting)
        members = [m for m in members if m[0].id in again] + fresh[room:]
    delay = _wait_s(bucket.receiver) if wait_s is None else wait_s
    for start in range(0, len(members), MAX_GROUP):
        chunk = members[start : start + MAX_GROUP]
        delivery = WebhookDelivery(
            receiver_id=bucket.receiver.id,
            status=bucket.status,
            group_key=key,
            state="pending",
            webhook_id=f"msg_{uuid.uuid4().hex}",
            attempts=0,
            next_attempt_at=now + timedelta(seconds=max(delay, 0)),
            created_at=now,
        )
        _fill(session, delivery, bucket, chunk, now, public_url)
        session.add(delivery)
        session.flush()
        _link(session, delivery, chunk)
        out.append(delivery)
    return out


def _wait_s(receiver: WebhookReceiver) -> int:
    """How long a new group waits: no wait when each incident is its own group."""
    return 0 if "incident_id" in receiver.group_by else receiver.group_wait_s


def _waiting(session: Session, receiver_id: int, key: str, now: datetime) -> WebhookDelivery | None:
    """The group's delivery still in its wait, not yet claimed by a sender (locked: a
    sender's claim skips it meanwhile, and a claimed one is no longer returned)."""
    query = (
        select(WebhookDelivery)
        .where(
            WebhookDelivery.receiver_id == receiver_id,
            WebhookDelivery.group_key == key,
            WebhookDelivery.state == "pending",
            WebhookDelivery.attempts == 0,
            WebhookDelivery.next_attempt_at > now,
        )
        .order_by(WebhookDelivery.id.desc())
        .limit(1)
        .with_for_update()
    )
    return session.scalar(query)


def _resent_since(session: Session, waiting: WebhookDelivery, incident_ids: list[int]) -> set[int]:
    """Of ``incident_ids`` (waiting in ``waiting``), those a delivery of another status to
    the same receiver has named since ``waiting`` was made."""
    if not incident_ids:
        return set()
    query = (
        select(DeliveryIncident.incident_id)
        .join(WebhookDelivery, WebhookDelivery.id == DeliveryIncident.delivery_id)
        .where(
            WebhookDelivery.receiver_id == waiting.receiver_id,
            WebhookDelivery.id > waiting.id,
            WebhookDelivery.status != waiting.status,
            DeliveryIncident.incident_id.in_(incident_ids),
        )
    )
    return set(session.scalars(query))


def group_members(session: Session, delivery_id: int) -> list[Member]:
    """The incidents a delivery names, with their job names, by incident id."""
    query = (
        select(Incident, Job.name)
        .join(DeliveryIncident, DeliveryIncident.incident_id == Incident.id)
        .join(Job, Job.id == Incident.job_id)
        .where(DeliveryIncident.delivery_id == delivery_id)
        .order_by(Incident.id)
    )
    return [(row, name) for row, name in session.execute(query).all()]


def _fill(
    session: Session,
    delivery: WebhookDelivery,
    bucket: _Bucket,
    members: list[Member],
    now: datetime,
    public_url: str,
) -> None:
    members = sorted(members, key=lambda m: m[0].id)
    payload = build_group(
        bucket.receiver.format,
        incidents=members,
        status=bucket.status,
        receiver=bucket.receiver.name,
        group_labels=bucket.labels,
        public_url=public_url,
        now=now,
    )
    # Plain JSON only (no NaN, no datetimes): what is stored is exactly what is sent.
    delivery.payload = formats.jsonable(payload)
    delivery.incident_id = members[0][0].id


def _link(session: Session, delivery: WebhookDelivery, members: list[Member]) -> None:
    session.add_all(DeliveryIncident(delivery_id=delivery.id, incident_id=m[0].id) for m in members)
    session.flush()


def incident_ids(session: Session, delivery_ids: list[int]) -> dict[int, list[int]]:
    """Each delivery's incidents (ids, ascending)."""
    out: dict[int, list[int]] = {d: [] for d in delivery_ids}
    if not delivery_ids:
        return out
    query = (
        select(DeliveryIncident.delivery_id, DeliveryIncident.incident_id)
        .where(DeliveryIncident.delivery_id.in_(delivery_ids))
        .order_by(DeliveryIncident.incident_id)
    )
    for delivery_id, incident_id in session.execute(query):
        out[delivery_id].append(incident_id)
    return out
