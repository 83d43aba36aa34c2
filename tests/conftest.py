"""Shared pytest fixtures: S3 servers, buckets, library configuration, a clean environment.

Servers start lazily: a test that asks for none of ``seaweedfs``, ``moto_s3``,
``s3_server``, ``real_s3`` (or a fixture built on them) starts nothing.

Fixtures:

* ``seaweedfs`` / ``moto_s3`` (session): one server each per test session. SeaweedFS
  checks signatures (an identities file: admin credentials for everything the fixtures
  do, a read-only identity in ``server.readonly``); moto accepts any credentials.
* ``s3_server`` (function): parametrized ``seaweedfs`` / ``moto``; a test using it (or
  ``bucket`` / ``s3_config``) runs once against each server.
* ``real_s3`` (session): always SeaweedFS, for semantics moto lacks (conditional copy, ...).
* ``bucket`` / ``s3_config``: a fresh bucket on ``s3_server`` and the library config for it.
* ``real_bucket`` / ``real_s3_config``: the same on ``real_s3``.
* ``spark`` (session): one local SparkSession (one JVM) for every Spark test of the
  session, docs/spark.md's examples included; ``spark_workdir`` is its working directory.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings

from tests.seaweedfs import start_seaweedfs
from tests.servers import S3Server, config_dict, start_moto

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Environment variable prefixes removed for the whole test session.
SCRUBBED_ENV_PREFIXES = ("PAWNQUEUE_", "AWS_")

# Tests assert behaviour, never timings: hypothesis's timing checks (a slow example, slow
# input generation) only measure how busy the machine is (four xdist workers on two
# cores). Tests that set their own settings still inherit these.
settings.register_profile(
    "pawnq", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("pawnq")


def pytest_configure(config: pytest.Config) -> None:
    """SIGINT as an interactive ``python`` has it: caught (KeyboardInterrupt), not
    blocked. A runner started in the background (``nohup ... &``: its shell ignores
    SIGINT and SIGQUIT) starts pytest, and every xdist worker, with SIGINT ignored;
    an ignored signal survives exec, and a Python started so keeps ignoring it, so the
    ``pawnq`` children that tests Ctrl-C (dashboard, stats --watch) never stop. Any
    handler set here is reset to the default in an exec'd child."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests of an ``xdist_group`` first: each group runs on one worker, one test after
    another (the Spark ones share a JVM per group), so they are the suite's longest
    chains; started first, the other tests fill the other workers around them."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)

_SERVER_FIXTURES = {"seaweedfs": "seaweedfs", "moto": "moto_s3"}


@pytest.fixture(scope="session", autouse=True)
def _clean_environment() -> Iterator[None]:
    """Remove ``PAWNQUEUE_*`` and ``AWS_*`` variables for the session, restore them after.

    Also points botocore at empty config/credentials files and turns off the EC2
    metadata lookup, so ``~/.aws`` can't change results and a missing credential
    fails at once instead of after IMDS timeouts. Tests that exercise environment
    handling set variables with ``monkeypatch``.
    """
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith(SCRUBBED_ENV_PREFIXES):
                mp.delenv(name)
        mp.setenv("AWS_CONFIG_FILE", os.devnull)
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        yield


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A SeaweedFS (``weed mini``) server for the whole session."""
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[S3Server]:
    """An in-process moto S3 server for the whole session."""
    server = start_moto()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=list(_SERVER_FIXTURES), ids=list(_SERVER_FIXTURES))
def s3_server(request: pytest.FixtureRequest) -> S3Server:
    """Each S3 server in turn (ids ``seaweedfs``, ``moto``); only the one needed starts."""
    server: S3Server = request.getfixturevalue(_SERVER_FIXTURES[request.param])
    return server


@pytest.fixture(scope="session")
def real_s3(seaweedfs: S3Server) -> S3Server:
    """Always SeaweedFS: for tests that need real S3 semantics (conditional copy, ...)."""
    return seaweedfs


def _bucket_on(server: S3Server) -> Iterator[str]:
    """Yield a fresh bucket on *server*; remove it afterwards on SeaweedFS."""
    name = server.make_bucket()
    yield name
    # Every SeaweedFS bucket holds a volume of its own (~0.2 s to allocate on first
    # write); deleting it (~0.03 s) keeps the volume count, and shutdown time, down.
    # moto keeps buckets in memory: nothing worth the time to clean up.
    if server.name == "seaweedfs":
        try:
            server.remove_bucket(name)
        except Exception as exc:  # cleanup must not turn a passing test into an error
            warnings.warn(f"could not remove bucket {name}: {exc!r}", stacklevel=1)


@pytest.fixture
def bucket(s3_server: S3Server) -> Iterator[str]:
    """A fresh, empty bucket on ``s3_server`` for this test."""
    yield from _bucket_on(s3_server)


@pytest.fixture
def s3_config(s3_server: S3Server, bucket: str) -> dict[str, Any]:
    """The library configuration dict for ``bucket`` on ``s3_server``."""
    return config_dict(s3_server, bucket)


@pytest.fixture
def real_bucket(real_s3: S3Server) -> Iterator[str]:
    """A fresh, empty bucket on SeaweedFS for this test."""
    yield from _bucket_on(real_s3)


@pytest.fixture
def real_s3_config(real_s3: S3Server, real_bucket: str) -> dict[str, Any]:
    """The library configuration dict for ``real_bucket`` on SeaweedFS."""
    return config_dict(real_s3, real_bucket)


@pytest.fixture(scope="session")
def spark_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working directory of the Spark JVM and of its Python workers.

    Relative paths in Spark calls resolve there (the JVM's, not this process's, current
    directory), so a test that uses them (docs/spark.md's examples) runs in it.
    """
    return tmp_path_factory.mktemp("spark-workdir")


@pytest.fixture(scope="session")
def spark(spark_workdir: Path) -> Iterator[SparkSession]:
    """One local SparkSession for the whole session (one JVM start: 7-16 s idle, far
    more under load), with the ``pawnqueue`` data source registered.

    Tuned for tests: four task slots (so the idle timeouts of ``process_topic``'s four
    tasks overlap instead of running in two waves), two shuffle partitions, no UI, a
    JVM that starts fast (``TieredStopAtLevel=1``, serial GC), reused Python workers
    (tests that check the other setting switch it per test).
    """
    from pyspark.sql import SparkSession

    from pawn_queue_sync.spark import register

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        mp.setenv("PYSPARK_PYTHON", sys.executable)  # workers need this venv
        mp.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        here = os.getcwd()
        os.chdir(spark_workdir)  # the JVM (and so every Python worker) starts here
        try:
            session = (
                SparkSession.builder.master("local[4]")
                .appName("pawn-queue-sync-tests")
                .config("spark.driver.bindAddress", "127.0.0.1")
                .config("spark.driver.host", "127.0.0.1")
                .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.default.parallelism", "2")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.python.worker.reuse", "true")
                .getOrCreate()
            )
        finally:
            os.chdir(here)
        session.sparkContext.setLogLevel("ERROR")
        register(session)
        try:
            yield session
        finally:
            session.stop()
