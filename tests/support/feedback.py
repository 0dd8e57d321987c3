"""Provider webhooks as the providers send them, signed with keys the tests make: Amazon SNS
(RSA over an X.509 certificate served by a local HTTPS server), SendGrid (ECDSA P-256), Postmark
(basic credentials) and Mailgun (HMAC-SHA256)."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import ssl
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature
from cryptography.x509.oid import NameOID

from reports.feedback import ses

TOPIC_ARN = "arn:aws:sns:us-east-1:123456789012:ses-feedback"
SENDGRID_KEY = ec.generate_private_key(ec.SECP256R1())
MAILGUN_KEY = "mailgun-test-signing-key-0123456789abcdef"
POSTMARK_AUTH = ("postmark", "postmark-test-password-0123456789")


def sendgrid_public_key(key: ec.EllipticCurvePrivateKey = SENDGRID_KEY) -> str:
    """The verification key as SendGrid shows it: base64 of the DER public key."""
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(der).decode()


def sendgrid_headers(body: bytes, timestamp: int, key: ec.EllipticCurvePrivateKey = SENDGRID_KEY) -> dict[str, str]:
    signature = key.sign(str(timestamp).encode() + body, ec.ECDSA(hashes.SHA256()))
    return {
        "X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(signature).decode(),
        "X-Twilio-Email-Event-Webhook-Timestamp": str(timestamp),
    }


#: The order of P-256, SendGrid's curve.
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def other_form(signature: str) -> str:
    """The other encoding of an ECDSA signature (r, n - s), which verifies as well as the first."""
    r, s = decode_dss_signature(base64.b64decode(signature))
    return base64.b64encode(encode_dss_signature(r, _P256_ORDER - s)).decode()


def sendgrid_event(event: str, email: str, **extra: Any) -> dict[str, Any]:
    return {
        "email": email,
        "timestamp": int(dt.datetime.now(dt.UTC).timestamp()),
        "event": event,
        "sg_event_id": uuid.uuid4().hex,
        "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0",
        **extra,
    }


def mailgun_post(
    event: dict[str, Any], *, timestamp: int, token: str | None = None, key: str = MAILGUN_KEY
) -> dict[str, Any]:
    token = token or uuid.uuid4().hex * 2
    signature = hmac.new(key.encode(), f"{timestamp}{token}".encode(), hashlib.sha256).hexdigest()
    return {"signature": {"timestamp": str(timestamp), "token": token, "signature": signature}, "event-data": event}


def mailgun_event(event: str, recipient: str, *, message_id: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex,
        "event": event,
        "timestamp": dt.datetime.now(dt.UTC).timestamp(),
        "recipient": recipient,
        "message": {"headers": {"message-id": message_id or f"{uuid.uuid4().hex}@mg.example.test"}},
        **extra,
    }


def postmark_authorization(user: str = POSTMARK_AUTH[0], password: str = POSTMARK_AUTH[1]) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def postmark_bounce(email: str, bounce_type: str = "HardBounce", **extra: Any) -> dict[str, Any]:
    return {
        "RecordType": "Bounce",
        "ID": int(uuid.uuid4().int % 10**12),
        "Type": bounce_type,
        "TypeCode": 1,
        "MessageID": str(uuid.uuid4()),
        "Email": email,
        "BouncedAt": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
        "Metadata": {},
        **extra,
    }


def postmark_complaint(email: str, **extra: Any) -> dict[str, Any]:
    return {**postmark_bounce(email, "SpamComplaint", TypeCode=512), "RecordType": "SpamComplaint", **extra}


# --- Amazon SNS ---------------------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@dataclass
class Pki:
    """A CA the tests trust (SNS_TEST_CA_FILE), the local server's certificate, and an SNS signing key."""

    folder: Path
    ca_file: Path = field(init=False)
    server_cert: Path = field(init=False)
    server_key: Path = field(init=False)
    signing_key: rsa.RSAPrivateKey = field(init=False)
    signing_pem: bytes = field(init=False)

    def __post_init__(self) -> None:
        now = dt.datetime.now(dt.UTC)
        ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        ca = (
            x509.CertificateBuilder()
            .subject_name(_name("reports test CA"))
            .issuer_name(_name("reports test CA"))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        self.signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        leaf = (
            x509.CertificateBuilder()
            .subject_name(_name("127.0.0.1"))
            .issuer_name(ca.subject)
            .public_key(self.signing_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=7))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        self.ca_file = self.folder / "ca.pem"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        # The one key both serves TLS and signs the SNS messages: the served certificate is the signing one.
        self.signing_pem = leaf.public_bytes(serialization.Encoding.PEM)
        self.server_cert = self.folder / "server.pem"
        self.server_cert.write_bytes(self.signing_pem)
        self.server_key = self.folder / "server.key"
        self.server_key.write_bytes(
            self.signing_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )


@dataclass
class SnsServer:
    """The local HTTPS server standing in for SNS: serves the signing certificate, takes confirmations."""

    base_url: str
    pki: Pki
    #: Paths requested, in order (the certificate, the SubscribeURLs visited).
    requests: list[str] = field(default_factory=list)
    #: How many of the next visits to a SubscribeURL SNS answers 500.
    failing_confirmations: list[int] = field(default_factory=lambda: [0])

    @property
    def cert_url(self) -> str:
        return f"{self.base_url}/SimpleNotificationService-test.pem"

    def subscribe_url(self, token: str) -> str:
        return f"{self.base_url}/?Action=ConfirmSubscription&TopicArn={TOPIC_ARN}&Token={token}"

    def message(
        self,
        message_type: str,
        *,
        message: str,
        topic_arn: str = TOPIC_ARN,
        version: str = "1",
        timestamp: dt.datetime | None = None,
        cert_url: str | None = None,
        subject: str | None = None,
        key: rsa.RSAPrivateKey | None = None,
    ) -> dict[str, str]:
        """An SNS message as SNS posts it, signed as SNS signs it."""
        at = timestamp or dt.datetime.now(dt.UTC)
        data = {
            "Type": message_type,
            "MessageId": str(uuid.uuid4()),
            "TopicArn": topic_arn,
            "Message": message,
            "Timestamp": at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z",
            "SignatureVersion": version,
            "SigningCertURL": cert_url or self.cert_url,
        }
        if subject is not None:
            data["Subject"] = subject
        if message_type != ses.NOTIFICATION:
            token = uuid.uuid4().hex
            data |= {"Token": token, "SubscribeURL": self.subscribe_url(token)}
        else:
            data["UnsubscribeURL"] = f"{self.base_url}/?Action=Unsubscribe"
        parsed = ses.Message(
            type=message_type,
            topic_arn=topic_arn,
            fields={k: v for k, v in data.items() if k in ses.SIGNED_FIELDS[message_type]},
            signature=b"",
            signature_version=version,
            signing_cert_url=data["SigningCertURL"],
        )
        algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()
        signature = (key or self.pki.signing_key).sign(ses.canonical(parsed), padding.PKCS1v15(), algorithm)
        data["Signature"] = base64.b64encode(signature).decode()
        return data


def ses_notification(
    kind: str, address: str, *, user_id: int | None = None, period: str | None = None, **detail: Any
) -> str:
    """An SES notification's JSON (the SNS notification form), with the original headers when given."""
    headers = []
    if user_id is not None:
        headers.append({"name": "X-Report-User-Id", "value": str(user_id)})
    if period is not None:
        headers.append({"name": "X-Report-Period", "value": period})
    mail = {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(),
        "messageId": f"0100{uuid.uuid4().hex}-000000",
        "source": "reports@reports.test",
        "destination": [address],
        "headersTruncated": False,
        "headers": headers,
        "commonHeaders": {"messageId": "<not-ours@example.test>"},
    }
    now = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
    if kind == "Bounce":
        body = {
            "bounceType": detail.get("bounce_type", "Permanent"),
            "bounceSubType": "General",
            "bouncedRecipients": [{"emailAddress": address, "status": "5.1.1", "action": "failed"}],
            "timestamp": now,
            "feedbackId": f"0100{uuid.uuid4().hex}-bounce",
        }
        return json.dumps({"notificationType": "Bounce", "bounce": body, "mail": mail})
    body = {
        "complainedRecipients": [{"emailAddress": address}],
        "timestamp": now,
        "feedbackId": f"0100{uuid.uuid4().hex}-complaint",
        "complaintFeedbackType": "abuse",
    }
    return json.dumps({"eventType": "Complaint", "complaint": body, "mail": mail})


@contextmanager
def sns_server(folder: Path) -> Iterator[SnsServer]:
    """A local HTTPS server with a certificate from a CA the tests make; stopped after."""
    pki = Pki(folder)
    requests: list[str] = []
    failing = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            requests.append(self.path)
            body = pki.signing_pem if self.path.endswith(".pem") else b"<ConfirmSubscriptionResponse/>"
            if not self.path.endswith(".pem") and failing[0]:
                failing[0] -= 1
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SnsServer(f"https://127.0.0.1:{server.server_address[1]}", pki, requests, failing)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
