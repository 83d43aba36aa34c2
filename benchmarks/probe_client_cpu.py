"""Where does the client's CPU go per S3 request? (a probe for the core's hot path)

    python -m benchmarks.probe_client_cpu [--endpoint URL] [--n 300] [--profile]

One thread, small objects, the same server: CPU per request of

* boto3 as :class:`~pawn_queue_sync.storage.s3.S3Store` configures it (PUT, conditional
  PUT, GET, DELETE);
* the same requests signed by hand (SigV4, ~60 lines) and sent with urllib3 -- the
  floor a minimal client for the queue's five hot operations could reach.

``--profile`` prints the top of a cProfile of the boto3 PUTs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import hashlib
import hmac
import io
import json
import pstats
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.server import ACCESS_KEY, SECRET_KEY, SeaweedServer


def cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class RawS3:
    """Path-style S3 over urllib3 with hand-made SigV4 headers (probe only)."""

    def __init__(self, endpoint: str, bucket: str, region: str = "us-east-1") -> None:
        import urllib3

        parts = urlsplit(endpoint)
        self.host = parts.netloc
        self.bucket = bucket
        self.region = region
        self.pool = urllib3.HTTPConnectionPool(parts.hostname, parts.port, maxsize=4)
        self._keys: dict[str, bytes] = {}

    def _signing_key(self, date: str) -> bytes:
        key = self._keys.get(date)
        if key is None:
            k = hmac.new(b"AWS4" + SECRET_KEY.encode(), date.encode(), hashlib.sha256).digest()
            for part in (self.region, "s3", "aws4_request"):
                k = hmac.new(k, part.encode(), hashlib.sha256).digest()
            self._keys[date] = key = k
        return key

    def request(self, method: str, key: str, body: bytes = b"",
                extra: dict[str, str] | None = None) -> Any:
        now = dt.datetime.now(dt.timezone.utc)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        date = amz_date[:8]
        path = "/" + quote(f"{self.bucket}/{key}", safe="/-_.~")
        payload_hash = hashlib.sha256(body).hexdigest()
        headers = {"host": self.host, "x-amz-content-sha256": payload_hash,
                   "x-amz-date": amz_date, **{k.lower(): v for k, v in (extra or {}).items()}}
        names = sorted(headers)
        canonical = "\n".join([
            method, path, "", *(f"{n}:{headers[n]}" for n in names), "",
            ";".join(names), payload_hash,
        ])
        scope = f"{date}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        sig = hmac.new(self._signing_key(date), to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, "
                                    f"SignedHeaders={';'.join(names)}, Signature={sig}")
        del headers["host"]
        return self.pool.urlopen(method, path, body=body or None, headers=headers,
                                 retries=False, preload_content=True)


def measure_interleaved(variants: list[tuple[str, Any]], n: int,
                        block: int = 25) -> list[dict[str, Any]]:
    """Run every variant ``n`` times in round-robin blocks of ``block`` requests, so a
    load that drifts during the probe (shared machine) hits every variant alike."""
    stats = {name: [0.0, 0.0, 0] for name, _ in variants}
    for _, fn in variants:
        fn(-1)  # warm up (connection, caches)
    done = 0
    while done < n:
        k = min(block, n - done)
        for name, fn in variants:
            c0, t0 = cpu(), time.perf_counter()
            for i in range(done, done + k):
                fn(i)
            st = stats[name]
            st[0] += cpu() - c0
            st[1] += time.perf_counter() - t0
            st[2] += k
        done += k
    rows = []
    for name, _ in variants:
        c, t, m = stats[name]
        row = {"op": name, "n": m, "cpu_ms_per_request": 1000 * c / m,
               "wall_ms_per_request": 1000 * t / m, "requests_per_s": m / t}
        print(f"{name:42s} {row['cpu_ms_per_request']:6.2f} ms CPU/request "
              f"{row['wall_ms_per_request']:6.2f} ms wall  {row['requests_per_s']:6.0f}/s")
        rows.append(row)
    return rows


def parse_timestamp_fast(value: str) -> dt.datetime:
    """What botocore's dateutil-based parser does for S3's ISO 8601 and HTTP dates."""
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        from email.utils import parsedate_to_datetime

        return parsedate_to_datetime(value)


def fast_timestamp_client(s3cfg: Any) -> Any:
    """A client built like S3Store's, but parsing timestamps with fromisoformat."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session()
    session._session.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=parse_timestamp_fast)
    return session.client(
        "s3", endpoint_url=s3cfg.endpoint_url, region_name=s3cfg.region_name,
        aws_access_key_id=s3cfg.aws_access_key_id,
        aws_secret_access_key=s3cfg.aws_secret_access_key,
        config=Config(request_checksum_calculation="when_required",
                      response_checksum_validation="when_required"))


def run(endpoint: str, n: int, profile: bool) -> list[dict[str, Any]]:
    from pawn_queue_sync.config import load_config
    from pawn_queue_sync.storage.s3 import S3Store

    bucket = "pqs-bench-probe"
    cfg = load_config({"s3": {"endpoint_url": endpoint, "bucket_name": bucket,
                              "aws_access_key_id": ACCESS_KEY,
                              "aws_secret_access_key": SECRET_KEY,
                              "use_ssl": False, "create_bucket": True}})
    assert cfg.s3 is not None
    store = S3Store(cfg.s3)
    store.ensure_bucket(create=True)
    client = store._client()
    raw = RawS3(endpoint, bucket)
    run_id = uuid.uuid4().hex[:8]
    body = json.dumps({"id": str(uuid.uuid4()), "payload": {"seq": 1, "t": time.time()}}).encode()
    variants: list[tuple[str, Any]] = []

    def key(prefix: str, i: int) -> str:
        return f"probe-{run_id}/{prefix}/{i}"

    variants.append(("boto3 PutObject", lambda i: client.put_object(
        Bucket=bucket, Key=key("a", i), Body=body, ContentType="application/json")))
    variants.append(("boto3 PutObject If-None-Match", lambda i: client.put_object(
        Bucket=bucket, Key=key("b", i), Body=body, IfNoneMatch="*")))
    variants.append(("boto3 GetObject", lambda i: client.get_object(
        Bucket=bucket, Key=key("a", i))["Body"].read()))
    variants.append(("boto3 DeleteObject", lambda i: client.delete_object(
        Bucket=bucket, Key=key("a", i))))
    fast = S3Store(cfg.s3)._client()  # a second client, without Expect: 100-continue
    from botocore.handlers import add_expect_header

    fast.meta.events.unregister("before-call.s3", add_expect_header)
    variants.append(("boto3 PutObject, no Expect: 100-continue", lambda i: fast.put_object(
        Bucket=bucket, Key=key("g", i), Body=body, ContentType="application/json")))
    variants.append(("boto3 PUT If-None-Match, no Expect", lambda i: fast.put_object(
        Bucket=bucket, Key=key("h", i), Body=body, IfNoneMatch="*")))
    variants.append(("S3Store.put (library wrapper)", lambda i: store.put(
        key("c", i), body)))
    variants.append(("raw urllib3+SigV4 PutObject", lambda i: raw.request(
        "PUT", key("d", i), body, {"content-type": "application/json"})))
    variants.append(("raw urllib3+SigV4 PUT If-None-Match", lambda i: raw.request(
        "PUT", key("e", i), body, {"if-none-match": "*"})))
    variants.append(("raw urllib3+SigV4 GetObject", lambda i: raw.request(
        "GET", key("d", i)).data))
    variants.append(("raw urllib3+SigV4 DeleteObject", lambda i: raw.request(
        "DELETE", key("d", i))))
    # Listing: botocore parses every LastModified with dateutil; a client whose
    # parser uses datetime.fromisoformat shows what that costs.
    listed = f"probe-{run_id}/listed/"
    for i in range(40):
        client.put_object(Bucket=bucket, Key=f"{listed}{i:03d}", Body=body)
    fast_ts = fast_timestamp_client(cfg.s3)
    variants.append(("boto3 ListObjectsV2, 40 keys", lambda i: client.list_objects_v2(
        Bucket=bucket, Prefix=listed, MaxKeys=40)))
    variants.append(("boto3 ListObjectsV2, 40 keys, fromisoformat",
                     lambda i: fast_ts.list_objects_v2(Bucket=bucket, Prefix=listed,
                                                      MaxKeys=40)))
    rows = measure_interleaved(variants, n)
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for i in range(n):
            client.put_object(Bucket=bucket, Key=key("f", i), Body=body)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
        print(out.getvalue())
    keys = [o.key for o in store.list(f"probe-{run_id}/").objects]
    store.delete_many(keys)
    store.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint")
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = p.parse_args(argv)
    with contextlib.ExitStack() as stack:
        endpoint = args.endpoint or stack.enter_context(SeaweedServer()).endpoint
        rows = run(endpoint, args.n, args.profile)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
