"""The Files API's upload form (bls.serve.files): the fields of a multipart/form-data body
as the email package reads them, found without parsing the whole message; a body cut
anywhere, or sent in an encoding bls does not take, refused with a 400, never another
error."""

from __future__ import annotations

import email.parser
import email.policy
import os
import random

import httpx
import pytest

from bls.serve.files import _form_fields, _upload
from bls.serve.framing import HttpError


def _form(data: bytes, filename: str = "in.jsonl", purpose: str = "batch") -> tuple[bytes, bytes]:
    """(content type, body) as httpx (the openai client's transport) makes them."""
    files = {"file": (filename, data, "application/octet-stream")}
    request = httpx.Request("POST", "http://x/v1/files", data={"purpose": purpose}, files=files)
    return request.headers["content-type"].encode(), request.read()


def _by_email(content_type: bytes, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """The fields as the email package's whole-message parser reads them."""
    head = b"Content-Type: " + content_type + b"\r\n\r\n"
    parsed = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in parsed.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields


def test_the_fields_are_those_the_email_package_reads() -> None:
    chooser = random.Random(7)
    for _ in range(200):
        data = os.urandom(chooser.randint(0, 4000))
        if chooser.random() < 0.3:
            data += b"\r\n--"  # (a tail like a delimiter's start)
        name = chooser.choice(["a.jsonl", "with space.jsonl", "\u00e9t\u00e9.jsonl"])
        content_type, body = _form(data, name, chooser.choice(["batch", "fine-tune", ""]))
        assert _form_fields(content_type, body) == _by_email(content_type, body)
    content_type, body = _form(b'{"custom_id": "1"}\n')
    assert _upload(content_type, body) == ("batch", "in.jsonl", b'{"custom_id": "1"}\n')


def test_a_body_cut_anywhere_is_a_400_or_its_fields() -> None:
    content_type, body = _form(b"line 1\nline 2\n" * 20)
    whole = _form_fields(content_type, body)
    for cut in range(len(body)):
        try:
            fields = _form_fields(content_type, body[:cut])
        except HttpError as error:
            assert error.status == 400 and "cut short" in error.message
        else:  # (cut before the first part, or after the last one ended)
            assert fields in ({}, whole, {"purpose": whole["purpose"]}), cut


def test_what_is_not_an_upload_bls_takes_is_refused_naming_why() -> None:
    with pytest.raises(HttpError, match="multipart/form-data"):
        _form_fields(b"application/json", b"{}")
    with pytest.raises(HttpError, match="names no boundary"):
        _form_fields(b"multipart/form-data", b"--x\r\n\r\n--x--")
    encoded = (
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n'
        b"Content-Transfer-Encoding: base64\r\n\r\nYWJj\r\n--b--\r\n"
    )
    with pytest.raises(HttpError, match="sent as 'base64'"):
        _form_fields(b"multipart/form-data; boundary=b", encoded)
    huge_head = b"--b\r\nX-Pad: " + b"x" * 20_000 + b"\r\n\r\ndata\r\n--b--\r\n"
    with pytest.raises(HttpError, match="headers are over 16 KiB"):
        _form_fields(b"multipart/form-data; boundary=b", huge_head)
    content_type, body = _form(b"x", purpose="batch")
    with pytest.raises(HttpError, match="no 'file' field"):
        _upload(content_type, body.replace(b'name="file"', b'name="other"'))
