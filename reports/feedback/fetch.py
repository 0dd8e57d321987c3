"""The two requests the web process makes to Amazon SNS: a signing certificate (cached) and a
subscription's confirmation. Only https, only to an SNS endpoint, never following a redirect.

The URLs are never logged: a SubscribeURL carries the subscription's token.
"""

from __future__ import annotations

import ssl
import threading
import urllib.error
import urllib.request
from collections import OrderedDict

from reports.errors import ConfigurationError
from reports.feedback import ses
from reports.feedback.events import Rejected

#: Longest wait for SNS, in seconds: the provider's own request is waiting on it.
TIMEOUT_SECONDS = 5.0
#: Largest certificate read, in bytes (SNS's are under 2 KiB).
MAX_CERTIFICATE_BYTES = 64 * 1024
#: Certificates kept: SNS signs with one per region at a time, and rotates them rarely.
CACHED_CERTIFICATES = 32


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect could lead off the SNS host that was checked: it is an error instead."""

    def redirect_request(self, *_args: object, **_kwargs: object) -> None:
        return None


class SnsFetcher:
    """Fetches from SNS with TLS verified against the system's CAs, or ``ca_file``'s (tests only).

    :param ca_file: SNS_TEST_CA_FILE: trust only these CAs, and let loopback hosts through.
    """

    def __init__(self, *, ca_file: str | None = None, timeout: float = TIMEOUT_SECONDS) -> None:
        self.allow_loopback = ca_file is not None
        self.timeout = timeout
        try:
            context = ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError):
            raise ConfigurationError(f"SNS_TEST_CA_FILE must be a readable PEM file of CAs, got {ca_file!r}.") from None
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), _NoRedirect())
        self._lock = threading.Lock()
        self._certificates: OrderedDict[str, bytes] = OrderedDict()

    def certificate(self, url: str) -> bytes:
        """The PEM at a message's SigningCertURL, from the cache when it was fetched before."""
        ses.check_sns_url(url, allow_loopback=self.allow_loopback)
        with self._lock:
            if url in self._certificates:
                self._certificates.move_to_end(url)
                return self._certificates[url]
        pem = self._get(url, limit=MAX_CERTIFICATE_BYTES)
        with self._lock:
            self._certificates[url] = pem
            while len(self._certificates) > CACHED_CERTIFICATES:
                self._certificates.popitem(last=False)
        return pem

    def confirm(self, subscribe_url: str) -> None:
        """Visit a verified SubscriptionConfirmation's SubscribeURL, which confirms the subscription."""
        ses.check_sns_url(subscribe_url, allow_loopback=self.allow_loopback)
        self._get(subscribe_url, limit=MAX_CERTIFICATE_BYTES)

    def _get(self, url: str, *, limit: int) -> bytes:
        try:
            with self._opener.open(url, timeout=self.timeout) as response:
                body: bytes = response.read(limit + 1)
        except urllib.error.HTTPError as e:
            if 300 <= e.code < 500:
                # A redirect, or no such certificate or subscription: the URL is not one SNS serves.
                raise Rejected(401, f"SNS answered {e.code} for the URL") from None
            raise Rejected(503, f"SNS answered {e.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            # 503: SNS retries the delivery, and the next try may reach it.
            raise Rejected(503, f"SNS could not be reached ({type(e).__name__})") from None
        if len(body) > limit:
            raise Rejected(502, "SNS answered with more than a certificate")
        return body
