"""Producer and consumer registration: a stable id per (role, name).

The id is ``uuid5(namespace, role/name)``, so every process computes the same id and
concurrent registrations cannot create two. An entry pawn-queue 0.1.3 wrote earlier
for the same name (a random uuid4) is found by a scan and reused.

Liveness: a consumer that polls rewrites its entry (``last_seen``, pawn-queue's JSON
shape) at most once per ``registry.heartbeat_interval_seconds`` (:func:`heartbeat`), and
registering again rewrites an entry older than one interval. :func:`rank` counts only
the entries the server saw written within ``LIVENESS_HEARTBEATS`` intervals, judged by
the server's clock (the listing's LastModified against its Date), never the client's.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import datetime
from typing import Any, Literal

import attrs

from .. import layout
from ..errors import ConditionFailed, ObjectNotFound, RegistrationError, StorageError
from .context import Context

log = logging.getLogger(__name__)

Role = Literal["producers", "consumers"]
NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://pypi.org/project/pawn-queue-sync/")
#: A registration counts as alive (see :func:`rank`) while the server saw its entry
#: written within this many ``registry.heartbeat_interval_seconds``: a polling consumer
#: rewrites it once an interval, so two missed beats are tolerated.
LIVENESS_HEARTBEATS = 3


@attrs.frozen
class RegistryEntry:
    """One registration, in pawn-queue's JSON shape."""

    role: str
    name: str
    entity_id: str
    registered_at: str
    last_seen: str

    @classmethod
    def from_json(cls, data: Any) -> RegistryEntry:
        if not isinstance(data, dict):
            raise ValueError("registry entry is not an object")
        return cls(**{f.name: str(data[f.name]) for f in attrs.fields(cls)})


def stable_id(role: Role, name: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{role}/{name}"))


def register(ctx: Context, role: Role, name: str) -> RegistryEntry:
    """Return the entry for ``name``, creating it once. Idempotent under concurrency."""
    if not isinstance(name, str) or not name or len(name) > 256:
        raise RegistrationError(f"{role[:-1]} name must be a non-empty string of <= 256 chars")
    entity_id = stable_id(role, name)
    key = layout.registry_key(role, entity_id)
    try:
        corrupt_etag: str | None = None
        try:
            got = ctx.store.get(key)
        except ObjectNotFound:
            legacy = _find_legacy(ctx, role, name)
            if legacy is not None:
                return _rewrite(ctx, legacy)  # as pawn-queue does when it registers again
        else:
            try:
                entry = RegistryEntry.from_json(json.loads(got.body))
            except (ValueError, KeyError, TypeError):
                # Unreadable, yet at the key only this name maps to: rewrite it below
                # (the id is the same whoever writes it).
                log.warning("replacing unreadable registry entry %s", key)
                corrupt_etag = got.etag
            else:
                if _older_than_a_beat(ctx, got.last_modified, got.server_time):
                    return _rewrite(ctx, entry)  # registering again: alive again
                return entry
        now = layout.iso(ctx.clock.now())
        entry = RegistryEntry(role, name, entity_id, now, now)
        body = layout.canonical_json(attrs.asdict(entry))
        try:
            if corrupt_etag is None:
                ctx.store.put(key, body, if_none_match=ctx.caps.if_none_match)
            else:
                if_match = corrupt_etag if ctx.caps.if_match else None
                ctx.store.put(key, body, if_match=if_match)
        except ConditionFailed:  # a concurrent registration won: same id, use its entry
            return RegistryEntry.from_json(json.loads(ctx.store.get(key).body))
        log.info("registered %s %r as %s", role[:-1], name, entity_id)
        return entry
    except (StorageError, ValueError, KeyError) as exc:
        error = RegistrationError(f"could not register {role[:-1]} {name!r}: {exc}")
        # an outage stays one (a worker pool waits it out; see StorageError.transient)
        error.transient = isinstance(exc, StorageError) and exc.transient
        raise error from exc


def _find_legacy(ctx: Context, role: Role, name: str) -> RegistryEntry | None:
    """The oldest entry with this name written by pawn-queue (random ids), if any."""
    found: list[RegistryEntry] = []
    for info in ctx.store.list(f"{layout.REGISTRY_PREFIX}{role}/").objects:
        if _is_ours(info.key):
            continue  # a uuid5 entry of another name: ours are found by key, not by scan
        try:
            entry = RegistryEntry.from_json(json.loads(ctx.store.get(info.key).body))
        except (ObjectNotFound, ValueError, KeyError, TypeError):
            continue  # vanished or foreign: not ours to judge here
        if entry.name == name and entry.role == role:
            found.append(entry)
    return min(found, key=lambda e: (e.registered_at, e.entity_id)) if found else None


def _is_ours(key: str) -> bool:
    try:
        return uuid.UUID(key.rsplit("/", 1)[-1].removesuffix(".json")).version == 5
    except ValueError:
        return False


def list_entries(ctx: Context, role: Role | None = None) -> list[RegistryEntry]:
    """All readable registrations, optionally of one role."""
    roles: list[Role] = [role] if role else ["producers", "consumers"]
    out: list[RegistryEntry] = []
    for r in roles:
        for info in ctx.store.list(f"{layout.REGISTRY_PREFIX}{r}/").objects:
            try:
                out.append(RegistryEntry.from_json(json.loads(ctx.store.get(info.key).body)))
            except (ObjectNotFound, ValueError, KeyError, TypeError):
                log.warning("skipping unreadable registry entry %s", info.key)
    return out


def heartbeat(ctx: Context, entry: RegistryEntry) -> RegistryEntry:
    """Rewrite ``entry`` with ``last_seen`` now (one unconditional PUT of pawn-queue's
    JSON shape, as pawn-queue's own heartbeat does): the server's LastModified of the
    entry is what :func:`rank` judges. Raises StorageError."""
    fresh = attrs.evolve(entry, last_seen=layout.iso(ctx.clock.now()))
    ctx.store.put(layout.registry_key(entry.role, entry.entity_id),
                  layout.canonical_json(attrs.asdict(fresh)))
    return fresh


def _rewrite(ctx: Context, entry: RegistryEntry) -> RegistryEntry:
    """:func:`heartbeat` at registration; a failure leaves the entry as it was (the
    first heartbeat of a poll writes it later)."""
    try:
        return heartbeat(ctx, entry)
    except StorageError as exc:
        log.warning("could not refresh registry entry of %s %r: %s", entry.role[:-1],
                    entry.name, exc)
        return entry


def _older_than_a_beat(
    ctx: Context, written: datetime | None, server_now: datetime | None
) -> bool:
    """Whether an entry written at ``written`` (server clock) is a heartbeat interval
    old or more by ``server_now``; either time unknown: yes (rewrite, to be safe)."""
    if server_now is None or written is None:
        return True
    age = (server_now - written).total_seconds()
    return age >= ctx.config.registry.heartbeat_interval_seconds


def rank(ctx: Context, role: Role, entity_id: str) -> tuple[int, int]:
    """Our place among the live ids registered in ``role`` and how many there are
    (counting us whether listed or not): one LIST of keys, no reads.

    An entry is live when the listing's server time is at most ``LIVENESS_HEARTBEATS``
    heartbeat intervals past its LastModified (both the server's clock). A listing
    without a server time counts every entry: the client clock never judges."""
    ours = layout.registry_key(role, entity_id)
    listing = ctx.store.list(f"{layout.REGISTRY_PREFIX}{role}/")
    now = listing.server_time
    window = LIVENESS_HEARTBEATS * ctx.config.registry.heartbeat_interval_seconds
    keys = sorted({
        info.key for info in listing.objects
        if now is None or info.last_modified is None
        or (now - info.last_modified).total_seconds() <= window
    } | {ours})
    return keys.index(ours), len(keys)
