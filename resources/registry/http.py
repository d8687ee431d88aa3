"""HttpRegistry: the OCI distribution API over HTTP(S) (ghcr.io in production).

Reads (HEAD/GET of manifests and blobs, and the token endpoint) are retried on 429, 5xx and broken
connections within a budget, and a blob that breaks mid-download resumes with a Range request.
Writes (POST/PUT/PATCH/DELETE) are never retried blindly: only a 401 challenge is answered, once.
A write asks the token endpoint for ``pull,push`` at its first challenge; tokens are kept per
(repository, actions). A token is only ever sent to an HTTPS realm (or one on this machine).
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urljoin, urlsplit

import dagster as dg
from pydantic import Field, PrivateAttr

from resources.deadline import limit
from resources.registry.base import PushCheck, Registry
from resources.registry.cache import BlobCache, default_cache_dir
from resources.registry.deadline import RequestDeadline, TooSlow, attach, read_all
from resources.registry.referrers import MAX_REFERRER_PAGES, next_page, parse_referrers
from resources.registry.refs import (
    MANIFEST_ACCEPT,
    MAX_MANIFEST_BYTES,
    OCI_INDEX,
    Descriptor,
    RawManifest,
    RegistryError,
    TagGuard,
    digest_of,
    is_digest,
    media_type_of,
    read_up_to,
)
from resources.registry.transport import (
    READS,
    RETRY_STATUSES,
    STATUS_HINTS,
    ResumableBody,
    RetryBudget,
    _broken,
    error_codes,
    error_detail,
    is_loopback,
    parse_challenge,
    skip_to,
    with_query,
)
from resources.secrets import quiet_urllib3, redact

if TYPE_CHECKING:
    import requests

GiB = 1024**3
# Distribution's codes for "this repository is readable and has no such thing".
_UNKNOWN_IN_REPO = frozenset({"MANIFEST_UNKNOWN", "BLOB_UNKNOWN"})


@dataclass(frozen=True)
class _NotFound:
    """Why a manifest request answered 404, remembered for absence()."""

    code: str | None  # the first distribution error code of the body; None: not known (a HEAD)
    auth: str  # what the request carried: "none" | "anonymous" (a token-less bearer) | "token"


class _Unreachable(Exception):
    """A request that never got an answer (refused, reset); carries the message to raise."""


class HttpRegistry(Registry):
    """The OCI distribution API over HTTP(S)."""

    host: str = Field(description="host[:port], e.g. ghcr.io or 127.0.0.1:5000")
    username: str | None = None
    token_env: str | None = Field(
        default=None, description="NAME of the env var holding the token/password"
    )
    token: str | None = Field(
        default=None,
        description="The token itself, as a dg.EnvVar of token_env when wired in Definitions; "
        "unset: read "
        "$token_env when the registry asks for a login.",
    )
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Every request (and every read of a body) gives up after this.",
    )
    # The total deadline ([timeouts] in the site,
    # resources/registry/deadline.py): timeout_s is per read.
    request_deadline_s: float = Field(
        default=120.0,
        gt=0,
        description="One request, body included, plus 1 s per min_body_bps bytes received.",
    )
    min_body_bps: int = Field(
        default=64 * 1024,
        gt=0,
        description="A body slower than this on average ends at the deadline.",
    )
    retry_attempts: int = Field(
        default=5, ge=1, description="Tries of one read (HEAD/GET, token) on 429, 5xx, resets."
    )
    retry_budget_s: float = Field(
        default=120.0,
        gt=0,
        description="No retry of a read ends later than this after its first failure.",
    )
    retry_base_s: float = Field(
        default=0.5, gt=0, description="First backoff step; doubles per try (full jitter)."
    )
    retry_max_wait_s: float = Field(
        default=30.0, gt=0, description="The longest single wait, Retry-After included."
    )
    blob_cache_dir: str = Field(
        default="",
        description="Layer cache; empty: $LOCKSTEP_CACHE/blobs or ~/.cache/lockstep/blobs.",
    )
    blob_cache_bytes: int = Field(
        default=8 * GiB, ge=0, description="Bound of the layer cache (LRU); 0: no cache."
    )

    _session: requests.Session | None = PrivateAttr(default=None)
    # Authorization header per (repository, actions)
    # from an answered challenge (never logged or shown).
    _auth: dict[tuple[str, str], str] = PrivateAttr(default_factory=dict)
    _bearers: set[str] = PrivateAttr(default_factory=set)
    _anonymous: set[str] = PrivateAttr(default_factory=set)  # bearers obtained without a token
    _not_found: dict[tuple[str, str], _NotFound] = PrivateAttr(default_factory=dict)

    @property
    def base_url(self) -> str:
        """Plain HTTP for a registry on this machine
        (127.0.0.1, localhost, [::1]), HTTPS otherwise."""
        if "://" in self.host or "/" in self.host:
            raise RegistryError(
                f"registry host {self.host!r} must be host[:port] only, e.g. ghcr.io or "
                "127.0.0.1:5000"
            )
        scheme = "http" if is_loopback(self.host) else "https"
        return f"{scheme}://{self.host}"

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    # -- primitives -------------------------------------------------------------------------------

    def _head_manifest(self, repository: str, reference: str) -> str | None:
        resp = self._send(
            "HEAD",
            repository,
            f"/manifests/{reference}",
            reference,
            headers={"Accept": MANIFEST_ACCEPT},
        )
        if resp.status_code == 404:
            # A HEAD has no body to say why; absence() asks
            # with a GET only if someone wants to know.
            self._not_found[(repository, reference)] = _NotFound(
                code=None, auth=self._auth_kind(resp)
            )
            return None
        self._expect(resp, (200,), "HEAD", repository, reference)
        if digest := resp.headers.get("Docker-Content-Digest"):
            return digest
        # Some registries omit the header: the digest is then the hash of the body itself.
        stored = self._get_manifest(repository, reference)
        return stored.digest if stored else None

    def _get_manifest(self, repository: str, reference: str) -> RawManifest | None:
        where = self._where(repository, reference)
        resp = self._send(
            "GET",
            repository,
            f"/manifests/{reference}",
            reference,
            headers={"Accept": MANIFEST_ACCEPT},
            stream=True,
        )
        if resp.status_code == 404:
            with contextlib.closing(resp):
                self._not_found[(repository, reference)] = self._why_not_found(resp)
            return None
        if resp.status_code != 200:
            with contextlib.closing(resp):
                self._expect(resp, (200,), "GET", repository, reference)
        headers = resp.headers
        body = self._resumable(
            resp, repository, f"/manifests/{reference}", reference, {"Accept": MANIFEST_ACCEPT}
        )
        with contextlib.closing(body):
            raw = read_up_to(body, MAX_MANIFEST_BYTES + 1)  # type: ignore[arg-type]
        if len(raw) > MAX_MANIFEST_BYTES:
            raise RegistryError(
                f"GET {where}: manifest is over {MAX_MANIFEST_BYTES} bytes; not reading it"
            )
        digest = digest_of(raw)
        claimed = headers.get("Docker-Content-Digest", "")
        if (is_digest(reference) and reference != digest) or (
            claimed.startswith("sha256:") and claimed != digest
        ):
            raise RegistryError(
                f"GET {where}: the manifest bytes hash to {digest}, not {claimed or reference}: "
                "a proxy altered them or the registry is corrupt"
            )
        media_type = media_type_of(headers.get("Content-Type"), raw)
        if media_type is None:
            raise RegistryError(
                f"GET {where}: the registry served something that is not an image manifest or index"
            )
        return RawManifest(raw=raw, media_type=media_type, digest=digest)

    def _put_manifest(
        self, repository: str, stored: RawManifest, tag: str | None, guard: TagGuard | None
    ) -> None:
        if (
            tag is not None
            and guard is not None
            and not guard(self._head_manifest(repository, tag))
        ):
            return
        reference = tag or stored.digest
        resp = self._send(
            "PUT",
            repository,
            f"/manifests/{reference}",
            reference,
            headers={"Content-Type": stored.media_type},
            data=stored.raw,
        )
        self._expect(resp, (201, 200), "PUT", repository, reference)
        answered = resp.headers.get("Docker-Content-Digest")
        if answered and answered != stored.digest:
            raise RegistryError(
                f"PUT {self._where(repository, reference)}: the registry stored digest "
                f"{answered}, not "
                f"{stored.digest}: it re-serialised the manifest; this registry cannot keep "
                "digests stable"
            )

    def _open_blob(self, repository: str, digest: str) -> BinaryIO:
        # identity: count and hash the bytes the registry stores, never a transport re-encoding.
        headers = {"Accept-Encoding": "identity"}
        resp = self._send(
            "GET", repository, f"/blobs/{digest}", digest, headers=headers, stream=True
        )
        if resp.status_code != 200:
            with contextlib.closing(resp):
                self._expect(
                    resp,
                    (200,),
                    "GET",
                    repository,
                    digest,
                    hint=(
                        "the blob is not in this repository: push it here (blobs are per "
                        "repository)"
                    ),
                )
        body = self._resumable(resp, repository, f"/blobs/{digest}", digest, headers)
        # A small buffer: a scan counts what it pulls, and the count should be close to the wire's.
        return io.BufferedReader(body, buffer_size=64 * 1024)  # type: ignore[return-value]

    def _put_blob(self, repository: str, digest: str, size: int, body: BinaryIO) -> None:
        head = self._send("HEAD", repository, f"/blobs/{digest}", digest)
        if head.status_code == 200:
            return
        if head.status_code != 404:
            self._expect(head, (200,), "HEAD", repository, digest)
        # Monolithic upload: POST opens an upload session, one PUT carries the bytes and the digest.
        start = self._send("POST", repository, "/blobs/uploads/", None)
        self._expect(start, (202,), "POST", repository, None, hint="could not start a blob upload")
        location = start.headers.get("Location")
        if not location:
            raise RegistryError(
                f"POST {self._where(repository)}/blobs/uploads/: HTTP 202 without a Location header"
            )
        url = with_query(urljoin(self.base_url + "/", location), digest=digest)
        put = self._send(
            "PUT",
            repository,
            url,
            digest,
            data=body,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )
        self._expect(put, (201, 204), "PUT", repository, digest, hint="the blob upload was refused")

    def _probe_push(self, repository: str) -> PushCheck:
        """Open a blob upload (what every push starts with, so the token is asked for `pull,push` as
        a push would be) and cancel it at once: the registry
        keeps nothing (distribution's DELETE on an upload's
        Location ends the session; an upload never finished expires on its own anyway)."""
        where = f"{self._where(repository)}/blobs/uploads/"
        proof = f"POST {where} (a blob upload, opened and then cancelled)"

        def refused(why: str) -> PushCheck:
            return PushCheck(
                repository=repository,
                allowed=False,
                proof=proof,
                refusal=self._redact(why),
                cancelled=True,
            )

        try:
            start = self._send("POST", repository, "/blobs/uploads/", None)
        # unreachable, no answer in time, a token that was refused or unset
        except RegistryError as exc:
            return refused(str(exc))
        with contextlib.closing(start):
            if start.status_code != 202:
                who = (
                    f"the token in ${self.token_env}"
                    if self.token_env
                    else "an anonymous client (no [registry] token_env)"
                )
                hint = (
                    f"the registry refused to start an upload for {who}: it cannot push to "
                    f"{repository} "
                    "(ghcr: a token with write:packages whose user may write this package)"
                    if start.status_code in (401, 403)
                    else None
                )
                try:
                    self._expect(start, (202,), "POST", repository, None, hint=hint)
                except RegistryError as exc:
                    return refused(str(exc))
            location = start.headers.get("Location")
        if not location:
            return refused(
                f"POST {where}: HTTP 202 without a Location header: the registry answers no upload "
                "session lockstep could use; check the registry host in the site file"
            )
        cancelled = self._cancel_upload(repository, urljoin(self.base_url + "/", location))
        note = (
            ""
            if cancelled
            else "; the registry did not take the cancel, so the empty session expires there"
        )
        return PushCheck(
            repository=repository, allowed=True, proof=proof + note, cancelled=cancelled
        )

    def _cancel_upload(self, repository: str, url: str) -> bool:
        """DELETE an upload session; True when the registry ended it (or had already: 404)."""
        try:
            resp = self._send("DELETE", repository, url, None)
        except RegistryError:
            return False
        with contextlib.closing(resp):
            return resp.status_code in (200, 202, 204, 404)

    def _referrers(
        self, repository: str, digest: str, artifact_type: str
    ) -> list[Descriptor] | None:
        """GET /v2/<name>/referrers/<digest> (OCI distribution 1.1), following `Link: rel="next"`
        pages. A 404 is a registry without the API
        (distribution 2.8): a registry that has it answers an
        empty index for a digest nothing refers to."""
        url, found = (
            with_query(
                f"{self.base_url}/v2/{repository}/referrers/{digest}", artifactType=artifact_type
            ),
            [],
        )
        for _ in range(MAX_REFERRER_PAGES):
            resp = self._send("GET", repository, url, digest, headers={"Accept": OCI_INDEX})
            with contextlib.closing(resp):
                if resp.status_code == 404 and not found:
                    return None
                self._expect(
                    resp, (200,), "GET", repository, digest, hint="the referrers API failed"
                )
                found += parse_referrers(
                    resp.content, f"GET {self._where(repository, digest)} referrers"
                )
                url = next_page(resp.headers.get("Link"), self.base_url)
            if url is None:
                return found
        raise RegistryError(
            f"GET {self._where(repository, digest)} referrers: over {MAX_REFERRER_PAGES} pages"
        )

    def _location(self) -> str:
        return self.host

    def _blob_cache(self) -> BlobCache | None:
        if self.blob_cache_bytes <= 0:
            return None
        root = (
            Path(self.blob_cache_dir).expanduser() if self.blob_cache_dir else default_cache_dir()
        )
        return BlobCache(root, self.blob_cache_bytes)

    def _redact(self, text: str) -> str:
        """Every message built from a registry's answer passes here: no token, ever."""
        return redact(text, self._secrets())

    # -- why a manifest is not there --------------------------------------------------------------

    def _why_not_found(self, resp: requests.Response) -> _NotFound:
        codes = error_codes(resp)
        return _NotFound(code=codes[0][0] if codes else "", auth=self._auth_kind(resp))

    def _absence(self, repository: str, reference: str) -> str:
        found = self._not_found.get((repository, reference))
        if found is None or found.code is None:
            # Not asked yet, or asked with a HEAD (no body):
            # a GET tells the distribution error code.
            resp = self._send(
                "GET",
                repository,
                f"/manifests/{reference}",
                reference,
                headers={"Accept": MANIFEST_ACCEPT},
            )
            with contextlib.closing(resp):
                if resp.status_code == 200:
                    return "present now: it was pushed after it was looked for"
                if resp.status_code not in (401, 403, 404):
                    return f"not readable: HTTP {resp.status_code} {resp.reason}"
                found = self._why_not_found(resp)
            self._not_found[(repository, reference)] = found
        if found.code in _UNKNOWN_IN_REPO and self._repository_readable(repository):
            what = "manifest" if is_digest(reference) else "tag"
            return f"absent: {repository} has no {what} {reference}"
        if found.auth == "token":
            return f"absent, or not readable with the token in ${self.token_env or 'token_env'}"
        if found.auth == "anonymous":
            return "absent, or private and needs a token (set token_env in the site's [registry])"
        if found.code in _UNKNOWN_IN_REPO or found.code == "NAME_UNKNOWN":
            # No login involved: the registry means it. (docker-registry says MANIFEST_UNKNOWN for
            # an unknown repository too; its tag list tells the two apart.)
            return f"absent: the registry has no repository {repository}"
        return "absent"

    def _repository_readable(self, repository: str) -> bool:
        resp = self._send("GET", repository, "/tags/list?n=1", None)
        with contextlib.closing(resp):
            return resp.status_code == 200

    def _auth_kind(self, resp: requests.Response) -> str:
        sent = (
            resp.request.headers.get("Authorization") if resp.request is not None else None
        ) or ""
        if not sent:
            return "none"
        if sent.startswith("Bearer ") and sent.removeprefix("Bearer ") in self._anonymous:
            return "anonymous"
        return "token"

    # -- requests and retries ----------------------------------------------------------------------

    def _http(self) -> requests.Session:
        if self._session is None:
            import requests

            quiet_urllib3()
            session = requests.Session()
            # A registry on this machine must not go through a proxy (or pick up ~/.netrc).
            session.trust_env = not is_loopback(self.host)
            self._session = session
        return self._session

    def _budget(self) -> RetryBudget:
        return RetryBudget(
            attempts=self.retry_attempts,
            budget_s=self.retry_budget_s,
            base_s=self.retry_base_s,
            max_wait_s=self.retry_max_wait_s,
        )

    def _url(self, repository: str, path_or_url: str) -> str:
        return (
            path_or_url if "://" in path_or_url else f"{self.base_url}/v2/{repository}{path_or_url}"
        )

    def _send(
        self,
        method: str,
        repository: str,
        path_or_url: str,
        reference: str | None,
        *,
        headers: dict[str, str] | None = None,
        data: bytes | BinaryIO | None = None,
        stream: bool = False,
        budget: RetryBudget | None = None,
    ) -> requests.Response:
        """One request with a timeout. A 401 challenge is answered once and the request sent again.
        A read is retried on 429/5xx/broken connections within `budget`; a write never is."""
        url = self._url(repository, path_or_url)
        where = self._where(repository, reference)
        read = method in READS
        actions = "pull" if read else "pull,push"
        budget = budget or self._budget()
        # An upload Location on another host (object storage) never gets the registry's token.
        same_host = urlsplit(url).netloc.lower() == self.host.lower()
        challenged = False
        while True:
            sent = dict(headers or {})
            if same_host and (auth := self._auth_for(repository, actions)):
                sent["Authorization"] = auth
            if hasattr(data, "seek"):
                data.seek(0)  # type: ignore[union-attr]
            try:
                resp = self._request(method, url, where, headers=sent, data=data, stream=stream)
            except _Unreachable as exc:
                if read and budget.again():
                    continue
                tries = f" ({budget.spent()})" if read else " (a write is not retried)"
                raise RegistryError(str(exc) + tries) from None
            if resp.status_code == 401 and not challenged:
                challenged = True
                if self._answer_challenge(resp, repository, actions, where):
                    resp.close()
                    continue
                return resp
            if read and resp.status_code in RETRY_STATUSES:
                if budget.again(resp):
                    resp.close()
                    continue
                with contextlib.closing(resp):
                    self._expect(
                        resp,
                        (),
                        method,
                        repository,
                        reference,
                        hint=(
                            f"the registry kept failing ({budget.spent()}): run again later, or "
                            "raise retry_budget_s"
                        ),
                    )
            return resp

    def _request(
        self, method: str, url: str, where: str, *, stream: bool = False, **kwargs: Any
    ) -> requests.Response:
        """One request within its total deadline: the smallest of request_deadline_s and what is
        left of the current budget (a sensor tick's). A body the caller
        does not stream is read here, checked against
        the deadline between socket reads; a streamed
        one is checked as it is read (ResumableBody)."""
        import requests

        seconds, name = limit(self.request_deadline_s, "[timeouts] registry_request_s")
        deadline = RequestDeadline(
            seconds=seconds, min_bps=self.min_body_bps, name=name, host=self.host
        )
        per_read, per_read_name = (
            (self.timeout_s, "timeout_s") if self.timeout_s <= seconds else (seconds, name)
        )
        try:
            resp = self._http().request(method, url, timeout=per_read, stream=True, **kwargs)
        except requests.Timeout:
            # Not retried: the wait already took timeout_s; ghcr's
            # transient failures are fast (429, 5xx, resets).
            raise RegistryError(
                f"{method} {where}: no answer from {self.host} within {per_read:g} s: "
                f"check the registry is up, or raise {per_read_name}"
            ) from None
        except requests.RequestException as exc:
            reason = self._redact(str(exc.__class__.__name__))
            raise _Unreachable(
                f"{method} {where}: cannot reach {self.host} ({reason}): check the host in the "
                "site "
                "file and that the registry is running and reachable from here"
            ) from None
        attach(resp, deadline)
        if not stream:
            try:
                read_all(resp, self.timeout_s)
            except _broken() as exc:
                resp.close()
                # As requests' own read of the body would: a body
                # that broke off is unreachable (reads retry).
                why = (
                    str(exc)
                    if isinstance(exc, TooSlow)
                    else f"the answer broke off ({exc.__class__.__name__})"
                )
                raise _Unreachable(self._redact(f"{method} {where}: {why}")) from None
        return resp

    def _resumable(
        self,
        resp: requests.Response,
        repository: str,
        path: str,
        reference: str,
        headers: dict[str, str],
    ) -> ResumableBody:
        """The body of a GET that, when it breaks off, is asked again from where it broke."""
        where = self._where(repository, reference)

        def reopen(offset: int, budget: RetryBudget) -> requests.Response:
            again = self._send(
                "GET",
                repository,
                path,
                reference,
                headers={**headers, "Range": f"bytes={offset}-"},
                stream=True,
                budget=budget,
            )
            if again.status_code not in (200, 206):
                with contextlib.closing(again):
                    self._expect(again, (200, 206), "GET", repository, reference)
            return skip_to(again, offset, where, per_read_s=self.timeout_s)

        return ResumableBody(resp, where, reopen, self._budget(), per_read_s=self.timeout_s)

    # -- auth -------------------------------------------------------------------------------------

    def _auth_for(self, repository: str, actions: str) -> str | None:
        # A push token also reads; a pull token must not be
        # sent on a write (ghcr answers 403, not a challenge).
        if actions == "pull":
            return self._auth.get((repository, "pull")) or self._auth.get((repository, "pull,push"))
        return self._auth.get((repository, "pull,push"))

    def _token(self) -> str:
        return self.token or (os.environ.get(self.token_env, "") if self.token_env else "")

    def _secrets(self) -> list[str]:
        values = [t] if (t := self._token()) else []
        if values:
            values.append(base64.b64encode(f"{self._user()}:{values[0]}".encode()).decode())
        return [*values, *self._bearers]

    def _user(self) -> str:
        return self.username or "lockstep"

    def _answer_challenge(
        self, resp: requests.Response, repository: str, actions: str, where: str
    ) -> bool:
        """Turn a 401's WWW-Authenticate into an
        Authorization header for (`repository`, `actions`)."""
        scheme, params = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
        creds = self._credentials(where)
        if scheme == "basic" and creds:
            self._auth[(repository, actions)] = (
                "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
            )
            return True
        if scheme != "bearer" or not params.get("realm"):
            return False
        # A write names its push scope itself: a challenge
        # may name pull only, and a pull token cannot push.
        scope = (
            params.get("scope")
            if actions == "pull" and params.get("scope")
            else f"repository:{repository}:{actions}"
        )
        token = self._fetch_bearer({**params, "scope": scope}, creds, where)
        self._bearers.add(token)
        if creds is None:
            self._anonymous.add(token)
        self._auth[(repository, actions)] = f"Bearer {token}"
        return True

    def _credentials(self, where: str) -> tuple[str, str] | None:
        if not self.token_env and not self.token:
            return None
        value = self._token()
        if not value:
            raise RegistryError(
                f"{where}: the registry wants a login and token_env names ${self.token_env}, "
                "which is unset "
                f"or empty here: export {self.token_env} with a registry token"
            )
        return self._user(), value

    def _fetch_bearer(
        self, params: dict[str, str], creds: tuple[str, str] | None, where: str
    ) -> str:
        """The docker token flow: GET the realm (with
        basic auth when we have a token) for a bearer."""
        realm = params["realm"]
        parts = urlsplit(realm)
        if creds and not (
            parts.scheme == "https" or (parts.scheme == "http" and is_loopback(parts.netloc))
        ):
            raise RegistryError(
                f"{where}: the registry sent its token endpoint as {realm}; lockstep sends a "
                "token only over "
                "HTTPS (or to this machine): check the registry host"
            )
        query = {k: params[k] for k in ("service", "scope") if params.get(k)}
        budget = self._budget()
        while True:
            try:
                resp = self._request("GET", realm, where, params=query, auth=creds)
            except _Unreachable as exc:
                if budget.again():
                    continue
                raise RegistryError(
                    self._redact(f"{exc} (its token endpoint {parts.netloc}; {budget.spent()})")
                ) from None
            if resp.status_code in RETRY_STATUSES and budget.again(resp):
                resp.close()
                continue
            break
        with contextlib.closing(resp):
            if resp.status_code != 200:
                who = f"the token in ${self.token_env}" if creds else "an anonymous request"
                failing = resp.status_code in RETRY_STATUSES
                raise RegistryError(
                    self._redact(
                        (
                            f"GET {where}: HTTP 401 from the registry, and its token endpoint "
                            f"{parts.netloc} "
                        )
                        + (
                            (
                                f"kept failing (HTTP {resp.status_code}, {budget.spent()}): "
                                "run again later"
                            )
                            if failing
                            else f"refused {who} (HTTP {resp.status_code}): check "
                            f"${self.token_env or 'token_env'} holds a "
                            "valid, unexpired token with read:packages (write:packages to push)"
                        )
                    )
                )
            try:
                body = resp.json()
                token = body.get("token") or body.get("access_token")
            except (ValueError, AttributeError):
                token = None
        if not token or not isinstance(token, str):
            raise RegistryError(
                f"GET {where}: the token endpoint {parts.netloc} answered without a token"
            )
        return token

    def _expect(
        self,
        resp: requests.Response,
        ok: tuple[int, ...],
        method: str,
        repository: str,
        reference: str | None,
        *,
        hint: str | None = None,
    ) -> None:
        if resp.status_code in ok:
            return
        detail = error_detail(resp) if method != "HEAD" else ""
        if resp.status_code == 401 and self.token_env:
            hint = (
                f"the registry refused the token in ${self.token_env}: check it is valid, "
                "unexpired and "
                "has read:packages (write:packages to push)"
            )
        if hint is None:
            status = resp.status_code
            hint = STATUS_HINTS.get(
                status,
                "the registry failed: run again later"
                if status >= 500
                else "unexpected answer from the registry",
            )
        if method not in READS and resp.status_code in RETRY_STATUSES:
            hint += "; a write is not retried blindly: read the state and run again"
        raise RegistryError(
            self._redact(
                f"{method} {self._where(repository, reference)}: HTTP {resp.status_code} "
                f"{resp.reason}{detail}: {hint}"
            )
        )
