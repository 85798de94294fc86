"""TLS settings and contexts without a gateway: the config's checks, a reload that keeps the
context and takes the new certificate, one that refuses a broken pair and changes nothing
(the listeners end to end: tests/e2e/test_tls_e2e.py)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from gateway.config import ConfigError, parse_config
from gateway.config.tls import TlsConfig
from gateway.core.tls import ClientTls, ServerTls, TlsError, client_context

trustme = pytest.importorskip("trustme")


def _files(folder: Path, ca: object, name: str) -> tuple[str, str]:
    cert = ca.issue_cert("127.0.0.1")  # type: ignore[attr-defined]
    chain, key = folder / f"{name}.pem", folder / f"{name}.key"
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key))
    return str(chain), str(key)


def test_tls_settings_are_checked(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = _files(tmp_path, ca, "server")
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    ok = parse_config({"gateway": {"tls": {"cert_file": cert, "key_file": key}}}).gateway
    assert ok.tls == TlsConfig(cert, key) and ok.grpc_tls is None
    worker = {"cert_file": cert, "key_file": key, "client_ca_file": str(ca_file)}
    assert parse_config({"gateway": {"worker_tls": worker}}).gateway.worker_tls.client_auth == "required"
    for tls, said in [
        ({"cert_file": cert}, "gateway.tls.key_file: expected a non-empty string"),
        ({"cert_file": cert, "key_file": str(tmp_path / "nope.key")}, "file not found"),
        ({"cert_file": cert, "key_file": key, "client_auth": "required"}, "client_ca_file: required"),
        ({"cert_file": cert, "key_file": key, "client_ca_file": str(ca_file)}, "say optional or required"),
        ({"cert_file": cert, "key_file": key, "client_auth": "sometimes"}, "must be one of"),
        ({"cert_file": cert, "key_file": key, "ciphers": "x"}, "unknown key"),
    ]:
        with pytest.raises(ConfigError) as err:
            parse_config({"gateway": {"tls": tls}})
        assert said in str(err.value)


async def _handshake(port: int, ca_file: Path) -> bytes:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    cert = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    del reader
    return bytes(cert)


async def test_a_reload_takes_the_new_certificate_in_the_same_context(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert, key = _files(tmp_path, ca, "server")
    tls = ServerTls(TlsConfig(cert, key))
    context = tls.context

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        first = await _handshake(port, ca_file)
        Path(key).write_text("broken\n")
        with pytest.raises(TlsError, match="do not load") as err:
            tls.reload()
        assert "broken" not in str(err.value)
        assert await _handshake(port, ca_file) == first
        new_cert, new_key = _files(tmp_path, ca, "fresh")
        Path(cert).write_bytes(Path(new_cert).read_bytes())
        Path(key).write_bytes(Path(new_key).read_bytes())
        tls.reload()
        assert tls.context is context
        second = await _handshake(port, ca_file)
        assert second != first and second == ssl.PEM_cert_to_DER_cert(
            Path(new_cert).read_text().split("\n\n")[0]
        )
    finally:
        server.close()
        await server.wait_closed()


def _client_files(tmp_path: Path) -> tuple[trustme.CA, Path, str, str]:
    """A CA (and its file) and a client certificate and key it issued."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert, key = _files(tmp_path, ca, "client")
    return ca, ca_file, cert, key


def test_a_client_context_presents_its_certificate_and_trusts_the_ca(tmp_path: Path) -> None:
    _, ca_file, cert, key = _client_files(tmp_path)
    ctx = client_context(TlsConfig(cert, key, str(ca_file), "required"))
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    with pytest.raises(TlsError):
        client_context(TlsConfig(cert, str(ca_file), str(ca_file), "required"))


async def test_a_reload_replaces_the_trusted_client_ca_and_open_connections_go_on(tmp_path: Path) -> None:
    """Client certificates: after a reload, one of a CA taken out of client_ca_file is refused,
    one of the new CA taken; a connection made before goes on with the session it has."""
    old, new = trustme.CA(), trustme.CA()
    cert, key = _files(tmp_path, old, "server")
    ca_file = tmp_path / "clients-ca.pem"
    old.cert_pem.write_to_path(str(ca_file))
    tls = ServerTls(TlsConfig(cert, key, str(ca_file), "required"), alpn=())

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
        writer.close()

    def client(server_ca: object, client_ca: object) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        server_ca.configure_trust(ctx)  # type: ignore[attr-defined]
        client_ca.issue_cert("client.example").configure_cert(ctx)  # type: ignore[attr-defined]
        return ctx

    async def says(ctx: ssl.SSLContext) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        try:
            writer.write(b"hello\n")
            await writer.drain()
            return await reader.readline()  # b"" when the server refused the certificate
        except (ssl.SSLError, ConnectionError):
            return b""
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=tls.context)
    port = server.sockets[0].getsockname()[1]
    try:
        kept_reader, kept = await asyncio.open_connection("127.0.0.1", port, ssl=client(old, old))
        assert await says(client(old, old)) == b"hello\n"
        assert await says(client(old, new)) == b""
        new_cert, new_key = _files(tmp_path, new, "fresh")
        Path(cert).write_bytes(Path(new_cert).read_bytes())
        Path(key).write_bytes(Path(new_key).read_bytes())
        new.cert_pem.write_to_path(str(ca_file))
        tls.reload()
        assert await says(client(new, new)) == b"hello\n"
        assert await says(client(new, old)) == b""  # the old CA's certificate: refused now
        kept.write(b"still here\n")
        await kept.drain()
        assert await kept_reader.readline() == b"still here\n"
        kept.close()
    finally:
        server.close()
        await server.wait_closed()


def test_a_client_reload_takes_new_files_for_the_next_connections(tmp_path: Path) -> None:
    ca, ca_file, cert, key = _client_files(tmp_path)
    link = ClientTls(TlsConfig(cert, key, str(ca_file), "required"))
    first = link.context
    Path(key).write_text("broken\n")
    with pytest.raises(TlsError):
        link.reload()
    assert (link.context, link.generation) == (first, 0)  # the files in use stay
    _files(tmp_path, ca, "client")
    link.reload()
    assert link.context is not first and link.generation == 1
