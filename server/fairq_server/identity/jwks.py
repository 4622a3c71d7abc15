"""Where the identity provider's keys come from: a JWKS URL (fetched, cached) or a file.

A URL is fetched with a time limit and a size limit, and its keys are cached. A token whose key
id is not in the cache makes fairq fetch the JWKS again (the provider rotated its keys), but
at most once per ``jwks_min_refresh_seconds``, so tokens with made-up key ids cannot turn fairq
into a flood against the provider; concurrent requests share one fetch. Keys older than
``jwks_cache_seconds`` are refreshed in the background while the cached ones keep verifying,
and while the URL is unreachable the cached keys keep working.

A file is re-read when it changes (its inode, size or modification time), checked at most once
a second for known key ids and at once for an unknown one.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import ssl
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

from fairq_server.config.identity import JwtConfig
from fairq_server.identity.keyset import JwksError, KeySet, parse_jwks
from fairq_server.names import escape
from fairq_server.runtime.supervisor import stop_task

__all__ = ["FileJwks", "JwksSource", "UrlJwks", "source_for"]

log = logging.getLogger(__name__)

_FILE_CHECK_SECONDS = 1.0


class JwksSource(Protocol):
    """The current keys, refreshed as needed."""

    #: What identifies this source's settings: an equal one may take over its cache.
    settings: tuple[object, ...]

    async def keys_for(self, kid: str) -> KeySet:
        """Return the keys to look ``kid`` up in, refreshing first if ``kid`` is unknown.

        Raises:
            JwksError: no keys are available at all (the message says why).

        """
        ...

    async def start(self) -> None:
        """Load the keys a first time (failures are logged; requests retry)."""
        ...

    async def close(self) -> None:
        """Stop background work and release connections."""
        ...


def source_for(config: JwtConfig, previous: JwksSource | None = None) -> JwksSource:
    """Return the source ``config`` names, reusing ``previous`` (and its cache) if equal.

    Raises:
        JwksError: naming the setting: the JWKS file cannot be read or holds no usable key,
            or the CA file cannot be read.

    """
    if config.jwks_url:
        source: JwksSource = UrlJwks(config)
    else:
        file = FileJwks(config.jwks_file, config.jwks_max_bytes)
        try:
            file.load()
        except JwksError as exc:
            raise JwksError(f"jwt.jwks_file: {exc}") from None
        source = file
    if previous is not None and previous.settings == source.settings:
        return previous
    return source


class UrlJwks:
    """A JWKS fetched over HTTP(S) and cached."""

    def __init__(self, config: JwtConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = config.jwks_url
        self.settings: tuple[object, ...] = (
            "url",
            config.jwks_url,
            config.jwks_ca_file,
            config.jwks_timeout_seconds,
            config.jwks_max_bytes,
            config.jwks_cache_seconds,
            config.jwks_min_refresh_seconds,
        )
        self._ssl: ssl.SSLContext | bool = True
        if config.jwks_ca_file:
            try:
                self._ssl = ssl.create_default_context(cafile=config.jwks_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise JwksError(
                    f"jwt.jwks_ca_file: cannot use {config.jwks_ca_file}: {exc}"
                ) from None
        parts = urlsplit(self.url)
        if parts.scheme == "http" and not _loopback(parts.hostname or ""):
            log.warning(
                "jwt.jwks_url %s is plain http: whoever can alter that traffic can mint "
                "identities; use https",
                self.url,
            )
        self._timeout = config.jwks_timeout_seconds
        self._max_bytes = config.jwks_max_bytes
        self._cache_seconds = config.jwks_cache_seconds
        self._min_refresh = config.jwks_min_refresh_seconds
        self._clock = clock
        self._keys: KeySet | None = None
        self._fetched_at = 0.0
        self._attempted_at: float | None = None
        self._error = "not fetched yet"
        self._fetch: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        #: Fetches made (successful or not), for tests and logs.
        self.fetches = 0

    async def start(self) -> None:
        """Fetch the keys once; a failure is logged and retried by the first token."""
        await self._refresh()
        if self._keys is None:
            log.warning("JWKS not loaded at start, tokens are refused until it is: %s", self._error)

    async def keys_for(self, kid: str) -> KeySet:
        """Return the cached keys, fetching first if ``kid`` is unknown and fetching is due.

        Raises:
            JwksError: no keys were ever fetched (the last failure is in the message).

        """
        keys = self._keys
        if keys is not None and kid in keys:
            if self._clock() - self._fetched_at >= self._cache_seconds and self._may_fetch():
                self._start_fetch()  # in the background: the cached key verifies this token
            return keys
        if self._may_fetch() or self._fetch is not None:
            await self._refresh()
        if self._keys is None:
            raise JwksError(f"the identity provider's keys are unavailable: {self._error}")
        return self._keys

    async def close(self) -> None:
        """Cancel a fetch under way and close the HTTP session."""
        self._closed = True
        self._error = "the JWKS source was closed (configuration reloaded or server stopping)"
        await stop_task(self._fetch)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _may_fetch(self) -> bool:
        if self._closed:  # a request still holding a verifier a reload replaced
            return False
        at = self._attempted_at
        return at is None or self._clock() - at >= self._min_refresh

    async def _refresh(self) -> None:
        """Wait for a fetch: the one under way, or a new one."""
        # asyncio.wait: a caller that goes away does not cancel the fetch others wait for,
        # and a fetch cancelled by close() leaves its waiters with the error set there.
        await asyncio.wait({self._start_fetch()})

    def _start_fetch(self) -> asyncio.Task[None]:
        if self._fetch is None:
            self._attempted_at = self._clock()
            self._fetch = asyncio.get_running_loop().create_task(self._fetch_once())
        return self._fetch

    async def _fetch_once(self) -> None:
        self.fetches += 1
        try:
            keys = parse_jwks(await self._get(), self.url)
        except Exception as exc:  # never an unobserved task error; the next token retries
            self._error = str(exc) if isinstance(exc, JwksError) else f"JWKS fetch failed: {exc!r}"
            kept = "keeping the cached keys" if self._keys is not None else "no keys cached"
            log.warning("JWKS refresh failed (%s): %s", kept, escape(self._error))
        else:
            if self._keys is not None and keys.kids != self._keys.kids:
                log.info("JWKS at %s now holds key ids %s", self.url, sorted(keys.kids))
            self._keys = keys
            self._fetched_at = self._clock()
        finally:
            self._fetch = None

    async def _get(self) -> bytes:
        """GET the JWKS, bounded in time and size.

        Raises:
            JwksError: unreachable, timed out, not 200, or larger than ``jwks_max_bytes``.

        """
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=2),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
        try:
            async with self._session.get(self.url, headers={"accept": "application/json"}) as r:
                if r.status != 200:
                    raise JwksError(f"JWKS at {self.url} answered HTTP {r.status}")
                if r.content_length is not None and r.content_length > self._max_bytes:
                    raise JwksError(self._too_large())
                body = bytearray()
                async for chunk in r.content.iter_chunked(65536):
                    body += chunk
                    if len(body) > self._max_bytes:
                        raise JwksError(self._too_large())
                return bytes(body)
        except TimeoutError:
            raise JwksError(f"JWKS at {self.url} timed out after {self._timeout:g} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise JwksError(f"JWKS at {self.url} unreachable: {exc}") from None

    def _too_large(self) -> str:
        return f"JWKS at {self.url} is larger than jwt.jwks_max_bytes ({self._max_bytes} bytes)"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class FileJwks:
    """A JWKS file, re-read when it changes."""

    def __init__(
        self, path: str, max_bytes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.settings: tuple[object, ...] = ("file", path, max_bytes)
        self._max_bytes = max_bytes
        self._clock = clock
        self._keys: KeySet | None = None
        self._seen: tuple[int, int, int] | None = None
        self._checked_at = 0.0
        self._error = "not read yet"

    def load(self) -> None:
        """Read the file now.

        Raises:
            JwksError: it cannot be read, is too large, or holds no usable key.

        """
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise JwksError(f"cannot read JWKS file {self.path}: {exc.strerror}") from None
        self._read((st.st_ino, st.st_mtime_ns, st.st_size))

    async def start(self) -> None:
        """Nothing to do: :meth:`load` read the file."""

    async def close(self) -> None:
        """Nothing to release."""

    async def keys_for(self, kid: str) -> KeySet:
        """Return the file's keys, re-read first if it changed.

        Raises:
            JwksError: the file never held usable keys.

        """
        now = self._clock()
        if (
            self._keys is None
            or kid not in self._keys
            or now - self._checked_at >= _FILE_CHECK_SECONDS
        ):
            self._checked_at = now
            self._check()
        if self._keys is None:
            raise JwksError(f"the identity provider's keys are unavailable: {self._error}")
        return self._keys

    def _check(self) -> None:
        """Re-read the file if it changed; on failure keep the keys read before."""
        try:
            st = os.stat(self.path)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen != self._seen:
                self._read(seen)
        except OSError as exc:
            self._fail(f"cannot read JWKS file {self.path}: {exc.strerror}")
        except JwksError as exc:
            self._fail(str(exc))

    def _fail(self, error: str) -> None:
        if error != self._error:  # once per distinct failure, not once per request
            kept = "keeping the keys read before" if self._keys is not None else "no keys"
            log.warning("JWKS file not reloaded (%s): %s", kept, escape(error))
        self._error = error

    def _read(self, seen: tuple[int, int, int]) -> None:
        # Remember what was read even if it fails: a bad file is reported once, not per request.
        self._seen = seen
        try:
            with open(self.path, "rb") as f:
                data = f.read(self._max_bytes + 1)
        except OSError as exc:
            raise JwksError(f"cannot read JWKS file {self.path}: {exc.strerror}") from None
        if len(data) > self._max_bytes:
            raise JwksError(
                f"JWKS file {self.path} is larger than jwt.jwks_max_bytes ({self._max_bytes})"
            )
        self._keys = parse_jwks(data, self.path)
        self._error = ""
