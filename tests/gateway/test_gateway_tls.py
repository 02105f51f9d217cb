"""--ssl-certfile/--ssl-keyfile: the server speaks https only, with a self-signed certificate made
here (cryptography), verified by the client against that certificate."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import httpx
import openai
import pytest
from gateway_support import LiveServer, chat_body, free_port, make_runtime, serve_config
from slotserve.gateway.app import create_app
from slotserve.gateway.server import check_tls_files


def self_signed(directory: Path, name: str = "slotserve-test") -> tuple[Path, Path]:
    """A P-256 key and a self-signed certificate for 127.0.0.1 and localhost, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def test_tls_serves_https_verified_against_the_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    runtime, _ = make_runtime()
    config = serve_config(port=free_port(), log_level="warning", ssl_certfile=str(cert), ssl_keyfile=str(key))
    assert config.url.startswith("https://127.0.0.1:")
    verify = ssl.create_default_context(cafile=str(cert))
    with LiveServer(create_app(runtime, config), runtime, config):
        with httpx.Client(verify=verify, trust_env=False, timeout=30) as client:
            assert client.get(config.url + "/health").status_code == 200
            r = client.post(
                config.url + "/v1/chat/completions",
                json=chat_body([{"role": "user", "content": "hi"}], max_tokens=2),
            )
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        sdk = openai.OpenAI(
            base_url=config.url + "/v1",
            api_key="none",
            max_retries=0,
            http_client=httpx.Client(verify=verify),
        )
        assert [m.id for m in sdk.models.list().data] == ["fake-model", "alias"]
        # a client that does not trust the certificate refuses it; plain http gets no answer
        with pytest.raises(httpx.ConnectError):
            httpx.get(config.url + "/health", trust_env=False, timeout=10)
        with pytest.raises(httpx.HTTPError):
            # (the server waits for a TLS handshake that never comes: the client times out)
            httpx.get(config.url.replace("https://", "http://") + "/health", trust_env=False, timeout=1)


def test_a_key_that_does_not_match_or_a_missing_file_is_refused_before_loading(tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path, "a")
    _, other_key = self_signed(tmp_path, "b")
    with pytest.raises(ValueError, match="--ssl-certfile"):
        check_tls_files(serve_config(ssl_certfile=str(cert), ssl_keyfile=str(other_key)))
    with pytest.raises(ValueError, match="--ssl-keyfile"):
        check_tls_files(serve_config(ssl_certfile=str(cert), ssl_keyfile=str(tmp_path / "missing.key")))
    check_tls_files(serve_config())  # no TLS: nothing to check


def test_the_cli_reports_a_bad_certificate_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from slotserve.cli import main

    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate")
    argv = [
        "serve",
        "--ssl-certfile",
        str(bogus),
        "--ssl-keyfile",
        str(bogus),
        "--model",
        "/nonexistent/m.gguf",
    ]
    assert main(argv) == 2
    assert "--ssl-certfile" in capsys.readouterr().err
