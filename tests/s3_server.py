"""An S3-compatible server for the tests: moto's server mode, as a child process.

``async with S3Server() as s3:`` starts ``python -m moto.server`` on a free loopback port,
waits until it answers HTTP, creates :attr:`S3Server.bucket`, and stops the process (by its
own PID) on the way out. :meth:`S3Server.environ` gives the ``AWS_*`` variables a client of
it reads (obstore's S3 store among them); a test sets them and isolates itself by a prefix
of its own in the one bucket.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

from baton.devkit.process import free_port

#: How long moto may take to start answering (it imports much of botocore first).
START_TIMEOUT_S = 60.0


class S3Server:
    """moto's S3 server on ``127.0.0.1:<port>`` with one bucket."""

    def __init__(self, log_dir: Path, bucket: str = "baton-tests") -> None:
        self.bucket = bucket
        self.log_path = log_dir / "moto.log"
        self.port = 0
        self._process: asyncio.subprocess.Process | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environ(self) -> dict[str, str]:
        """What an S3 client needs to reach this server (moto takes any credentials)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "baton-test",
            "AWS_SECRET_ACCESS_KEY": "baton-test-secret",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    async def start(self) -> None:
        for _ in range(3):  # a free port taken meanwhile: the process exits, try another
            self.port = free_port()
            with self.log_path.open("ab") as log:
                self._process = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                    str(self.port), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log)
            if await self._ready():
                break
        else:
            raise RuntimeError(f"moto did not start: see {self.log_path}")
        async with httpx.AsyncClient(base_url=self.endpoint) as http:
            created = await http.put(f"/{self.bucket}")
            created.raise_for_status()

    async def _ready(self) -> bool:
        """Poll the server until it answers, the process exits (False) or time is up."""
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        async with httpx.AsyncClient(base_url=self.endpoint, timeout=2.0) as http:
            while time.monotonic() < deadline:
                if self._process.returncode is not None:
                    return False
                try:
                    if (await http.get("/moto-api/")).status_code < 500:
                        return True
                except httpx.TransportError:
                    pass
                try:  # wait for the process to exit, or poll again
                    await asyncio.wait_for(self._process.wait(), 0.1)
                except TimeoutError:
                    pass
        await self.stop()
        raise RuntimeError(f"moto did not answer within {START_TIMEOUT_S:g} s: see "
                           f"{self.log_path}")

    async def stop(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()

    async def __aenter__(self) -> S3Server:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
