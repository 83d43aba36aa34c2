"""The capability probe: does the server honour If-None-Match and If-Match, also when
requests race?

Conditional writes have had concurrency bugs in real servers (a SeaweedFS release
answered 200 to three concurrent ``If-None-Match: *`` creates of one key; RustFS and
versitygw had similar races). A sequential check cannot see that, so the probe races:
:data:`ROUNDS` rounds of :data:`RACERS` concurrent creates of one fresh key with
``If-None-Match: *`` and then as many concurrent ``If-Match`` updates against its one
known ETag; each race must have exactly one winner. Once, it also checks that a PUT and
a DELETE with a wrong ETag are refused. 27 requests; the scratch objects
(``_probe/{uuid}.probe``) are always removed.

The result is cached for the process per store (endpoint + bucket, or local path), so
workers and queues after the first do not pay for it again; concurrent setups on one
store wait for one probe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import attrs

from .. import layout
from ..config import redact_endpoint
from ..errors import (
    ConditionFailed,
    ObjectNotFound,
    ProbeError,
    StorageError,
    StoreUnavailable,
)
from ..storage.base import PutResult, Store
from .lease import Capabilities

__all__ = ["ROUNDS", "RACERS", "ProbeReport", "capabilities", "clear_cache", "probe"]

log = logging.getLogger(__name__)

#: Rounds of races; each uses a fresh key.
ROUNDS = 5
#: Concurrent requests per race. Two overlapping requests are all a check-then-write
#: race needs to show; more cost time for nothing on SeaweedFS, which answers each
#: extra loser contending for a key's lock after about a second (measured with 4.48:
#: 2 racers ~10 ms a race, 3 or 4 racers 1-2 s in half the races).
RACERS = 2
#: Seconds a racer waits at the starting line for the others before giving up.
_START_TIMEOUT = 30.0
_WRONG_ETAG = "0" * 32


@attrs.frozen
class ProbeReport:
    """What the probe found: each check that failed, in words, per header."""

    if_none_match_failures: tuple[str, ...] = ()
    if_match_failures: tuple[str, ...] = ()

    @property
    def if_none_match(self) -> bool:
        return not self.if_none_match_failures

    @property
    def if_match(self) -> bool:
        return not self.if_match_failures

    @property
    def failures(self) -> tuple[str, ...]:
        return self.if_none_match_failures + self.if_match_failures

    @property
    def caps(self) -> Capabilities:
        return Capabilities(if_none_match=self.if_none_match, if_match=self.if_match)


# -- the probe ----------------------------------------------------------------------------


def probe(store: Store, *, rounds: int = ROUNDS, racers: int = RACERS) -> ProbeReport:
    """Race conditional writes on scratch objects (always removed) and report what held.

    Raises :class:`StoreUnavailable` when the store refuses us (credentials, bucket),
    with a hint when a write is denied (read-only credentials), and :class:`ProbeError`
    on any other error: never a guess.
    """
    where = redact(store.describe())
    inm_failures: list[str] = []
    im_failures: list[str] = []
    with ThreadPoolExecutor(racers, thread_name_prefix="pqs-probe") as pool:
        for number in range(1, rounds + 1):
            key = layout.probe_key()
            try:
                _round(store, pool, key, number, racers, inm_failures, im_failures)
            except StoreUnavailable as exc:
                _cleanup_quietly(store, key)
                raise _denied(exc, where) from None
            except StorageError as exc:
                _cleanup_quietly(store, key)
                raise ProbeError(f"capability probe failed on {where}: {exc}",
                                 transient=exc.transient) from None
            except BaseException:
                _cleanup_quietly(store, key)
                raise
            _remove(store, key, where)
    return ProbeReport(tuple(inm_failures), tuple(im_failures))


def _round(
    store: Store,
    pool: ThreadPoolExecutor,
    key: str,
    number: int,
    racers: int,
    inm_failures: list[str],
    im_failures: list[str],
) -> None:
    """One round on ``key``: a create race, an update race, and (first round) the
    wrong-ETag checks. Failures are appended in words; errors raise."""
    won = _race(pool, racers, lambda i: store.put(key, _body("create", i), if_none_match=True))
    if len(won) != 1:
        inm_failures.append(
            f"If-None-Match: {len(won)} of {racers} concurrent creates of one new key "
            f"succeeded in round {number} (exactly one must)"
        )
    known = won[0].etag if len(won) == 1 else store.put(key, _body("base", 0)).etag
    won = _race(pool, racers, lambda i: store.put(key, _body("update", i), if_match=known))
    if len(won) != 1:
        im_failures.append(
            f"If-Match: {len(won)} of {racers} concurrent updates of one version "
            f"succeeded in round {number} (exactly one must)"
        )
    if number != 1:
        return
    try:
        store.put(key, _body("wrong", 0), if_match=_WRONG_ETAG)
        im_failures.append("If-Match: a PUT with a wrong ETag succeeded")
    except ConditionFailed:
        pass
    try:
        store.delete(key, if_match=_WRONG_ETAG)
        im_failures.append("If-Match: a DELETE with a wrong ETag succeeded")
    except ConditionFailed:
        pass


def _race(
    pool: ThreadPoolExecutor, racers: int, write: Callable[[int], PutResult]
) -> list[PutResult]:
    """Run ``write(i)`` for each racer at once (a barrier starts them together); the
    winners' results. A loser is a ConditionFailed; any other error is raised (the
    first one, after every racer has finished)."""
    start = threading.Barrier(racers)

    def run(i: int) -> PutResult | None:
        with contextlib.suppress(threading.BrokenBarrierError):  # race anyway: it counts
            start.wait(_START_TIMEOUT)
        try:
            return write(i)
        except ConditionFailed:
            return None

    futures = [pool.submit(run, i) for i in range(racers)]
    results: list[PutResult] = []
    error: BaseException | None = None
    for future in futures:
        try:
            result = future.result()
        except BaseException as exc:  # every racer finishes before anything is raised
            if error is None or (
                isinstance(exc, StoreUnavailable) and not isinstance(error, StoreUnavailable)
            ):
                error = exc
            continue
        if result is not None:
            results.append(result)
    if error is not None:
        raise error
    return results


def _body(kind: str, racer: int) -> bytes:
    """A body no other request writes (so every write has its own ETag)."""
    return f'{{"probe":"{kind}","racer":{racer},"nonce":"{secrets.token_hex(8)}"}}'.encode()


def _denied(exc: StoreUnavailable, where: str) -> StoreUnavailable:
    """The store failed a probe request: say where; when it denied a write
    (AccessDenied), say that the queue must write."""
    text = str(exc)
    if "AccessDenied" not in text:  # unreachable, wrong secret, no bucket: as it is
        return StoreUnavailable(f"capability probe on {where} failed: {text}",
                                transient=exc.transient)
    return StoreUnavailable(
        f"capability probe: access denied by {where} ({text}); the credentials may "
        "not write: read-only credentials (or a policy without PutObject/DeleteObject) "
        "cannot run a queue"
    )


def _remove(store: Store, key: str, where: str) -> None:
    """Delete a probe object, retrying; a ProbeError if it cannot be removed."""
    last: StorageError | None = None
    for _ in range(3):
        try:
            store.delete(key)
            return
        except ObjectNotFound:
            return
        except StorageError as exc:
            last = exc
    raise ProbeError(f"could not remove probe object {key} on {where}: {last}",
                     transient=last is not None and last.transient)


def _cleanup_quietly(store: Store, key: str) -> None:
    """Remove a probe object while another error is on its way out: that error is the
    one to report, so a failed removal is only logged. An object never written (a
    denied write) is not deleted: read-only credentials could not, and need not."""
    try:
        store.head(key)
    except ObjectNotFound:
        return
    except StorageError:
        pass  # cannot tell: try to delete it
    try:
        _remove(store, key, redact(store.describe()))
    except StorageError as exc:
        log.warning("%s", exc)


#: ``s3:http://user:pass@host/b`` -> ``s3:http://***@host/b``: no userinfo (the one
#: masking of :mod:`pawn_queue_sync.config`).
redact = redact_endpoint


# -- per process, per store -------------------------------------------------------------------

_CACHE: dict[str, ProbeReport] = {}
_LOCKS: dict[str, threading.Lock] = {}
_GUARD = threading.Lock()


def _cache_key(store: Store) -> str | None:
    """What identifies ``store`` across instances: endpoint + bucket, or the local
    path (their ``describe()``); None for other stores (memory, test wrappers), which
    are probed every time."""
    from ..storage.local import LocalStore

    if type(store) is LocalStore:
        return store.describe()
    s3 = _s3_store_class()
    if s3 is not None and type(store) is s3:
        return store.identity()  # type: ignore[attr-defined,no-any-return]
    return None


def _s3_store_class() -> type | None:
    try:
        from ..storage.s3 import S3Store
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return None
    return S3Store


def _reset_locks_after_fork() -> None:
    """A lock held by another thread at fork would never be released in the child;
    the results themselves stay valid."""
    global _GUARD
    _GUARD = threading.Lock()
    _LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_after_fork)


def cached_probe(store: Store) -> tuple[ProbeReport, bool]:
    """The store's probe report, probing only on the first call for this store in this
    process; and whether it came from the cache."""
    known = getattr(store, "known_conditions", None)
    if callable(known):  # a store that knows what it enforces (local) is not probed
        conditions = known()
        return ProbeReport(
            () if conditions.if_none_match else ("the store does not enforce If-None-Match",),
            () if conditions.if_match else ("the store does not enforce If-Match",),
        ), False
    key = _cache_key(store)
    if key is None:
        return probe(store), False
    with _GUARD:
        report = _CACHE.get(key)
        if report is not None:
            return report, True
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:  # concurrent setups on one store: one probes, the others wait for it
        report = _CACHE.get(key)
        if report is not None:
            return report, True
        report = probe(store)  # errors are not cached: the next setup probes again
        with _GUARD:
            _CACHE[key] = report
        return report, False


def clear_cache() -> None:
    """Forget every probe result of this process (tests; a server upgraded in place)."""
    with _GUARD:
        _CACHE.clear()


def capabilities(store: Store, strategy: str) -> Capabilities:
    """The capabilities a queue on ``store`` uses with ``concurrency.strategy``.

    ``auto``: conditional_write when the probe passed, else csprng_verify with a
    warning naming the server and what failed. ``conditional_write``: a
    :class:`ProbeError` naming the failure when If-None-Match did not hold.
    ``csprng_verify``: never If-None-Match. If-Match is used only where it held.
    """
    report, cached = cached_probe(store)
    where = redact(store.describe())
    if cached:
        log.debug("capabilities of %s from this process's earlier probe", where)
    if not report.if_none_match:
        failures = "; ".join(report.if_none_match_failures)
        if strategy == "conditional_write":
            raise ProbeError(
                f"concurrency.strategy is conditional_write, but {where} does not honour "
                f"If-None-Match under concurrent requests: {failures}; use csprng_verify "
                "(or auto)"
            )
        if strategy == "auto":
            log.warning(
                "%s does not honour conditional writes (%s): falling back to csprng_verify",
                where, failures,
            )
    if not report.if_match:
        log.warning(
            "%s does not honour If-Match (%s): leases are fenced without it",
            where, "; ".join(report.if_match_failures),
        )
    caps = report.caps
    if strategy == "csprng_verify":
        caps = Capabilities(if_none_match=False, if_match=caps.if_match)
    return caps
