"""TLS for the reward servers and their clients: the checks that name the flag or field
at fault before a server starts or a client sends, and the client's verification.

Without TLS the bearer token, the images and the prompts cross the network in clear.
A server given a certificate and its key (``--tls-cert``/``--tls-key``,
``train.reward.tls_cert_file``/``tls_key_file``) serves HTTPS and advertises an
https:// URL; a client verifies it against a CA bundle (``train.reward.tls_ca_file``,
``RewardClient(ca_file=...)``), or against the system's CAs when none is given."""

from __future__ import annotations

import ssl
from pathlib import Path

from ..common.errors import ConfigError, G2RPOError, UsageError

CA_FIELD = "train.reward.tls_ca_file"


class RewardTLSError(G2RPOError, RuntimeError):
    """A reward server's certificate this client does not trust: a setting to fix, not
    a replica to fail over from."""


def _error(name: str, message: str) -> G2RPOError:
    """A flag's problem as UsageError, a config field's as ConfigError."""
    return (UsageError if name.startswith("--") else ConfigError)(f"{name} {message}")


def check_server_tls(
    cert: str | None,
    key: str | None,
    cert_name: str = "--tls-cert",
    key_name: str = "--tls-key",
) -> None:
    """Both or neither; each a file here; together a certificate and its private key.
    The names are the flags or config fields they came from."""
    if cert is None and key is None:
        return
    if cert is None or key is None:
        given, missing = (cert_name, key_name) if key is None else (key_name, cert_name)
        raise _error(given, f"is given without {missing}: a certificate needs its private key")
    for path, name in ((cert, cert_name), (key, key_name)):
        if not Path(path).is_file():
            raise _error(name, f"{path}: no such file (on this node)")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise _error(
            cert_name, f"{cert} with {key_name} {key}: not a PEM certificate and its key ({exc})"
        ) from None


def client_verify(ca_file: str | None, name: str = CA_FIELD) -> ssl.SSLContext | bool:
    """What a client verifies servers with: the CA bundle ``ca_file`` (named ``name`` in
    errors), or True (the system's CAs) when None."""
    if ca_file is None:
        return True
    if not Path(ca_file).is_file():
        raise _error(name, f"{ca_file}: no such file")
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise _error(name, f"{ca_file}: not a PEM CA bundle ({exc})") from None


def require_https(urls: list[str], name: str) -> None:
    """With a CA bundle set, replicas are reached over TLS only: a plain http:// one among
    ``urls`` (named ``name``) would get the token and images in clear."""
    plain = [u for u in urls if not u.startswith("https://")]
    if plain:
        raise _error(
            CA_FIELD,
            f"is set, so reward replicas are reached over https:// only: {name} {plain} "
            "would get the token and images in clear",
        )


def unverified_certificate(exc: BaseException) -> str | None:
    """Why the server's certificate failed verification, when that is what ``exc``
    (an httpx error, its causes) comes down to; else None."""
    seen = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen.verify_message or str(seen)
        seen = seen.__cause__ or seen.__context__
    return "certificate verify failed" if "CERTIFICATE_VERIFY_FAILED" in str(exc) else None


def untrusted_server(url: str, reason: str) -> RewardTLSError:
    return RewardTLSError(
        f"the reward server at {url} presented a certificate this client does not trust "
        f"({reason}): give the CA bundle that signed it as {CA_FIELD} (RewardClient's "
        "ca_file), and a certificate naming the address in the URL"
    )
