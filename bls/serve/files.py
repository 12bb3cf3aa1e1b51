"""OpenAI's Files API, for batches (:mod:`.batches`): ``POST /v1/files`` (multipart:
``file``, ``purpose=batch``) keeps a file in the runs store (on SQLite, its bytes beside
the database: :mod:`bls.file_bytes`), ``GET /v1/files``, ``GET
/v1/files/ID``, ``GET /v1/files/ID/content`` and ``DELETE /v1/files/ID`` list, read and
remove one; a batch's output and error files are kept the same way.

Bounds: a file is at most ``[runs] max_file_bytes`` (413), its body arrives within
:data:`BODY_S` (408), at most :data:`MAX_UPLOADS` uploads are under way at once (more:
503 with Retry-After), and an upload is parsed in a worker thread, not on the event loop.
"""

from __future__ import annotations

import email.parser
import email.policy
import uuid

import anyio
import anyio.to_thread
import msgspec

from ..config import RunsConfig
from ..journal import Journal
from ..journal_files import FileRow
from .framing import HttpError, Receive, Scope, Send, holding, respond, send_error
from .intake import Disconnected, header, query_of, request_id_of, route_body
from .routing import Route
from .run_routes import list_limit

__all__ = ["BODY_S", "MAX_UPLOADS", "Files", "file_body"]

BODY_S = 60.0  # how long an upload's body (or a batch's request) may take to arrive
MAX_UPLOADS = 4  # uploads under way at once in a frontend, at most (more: 503)
_MAX_LIST = 10_000  # files a page lists, at most (and when not asked: OpenAI's default)
_encode = msgspec.json.encode


class Files:
    """The routes (:attr:`routes`) of the Files API over ``journal``."""

    def __init__(self, journal: Journal, config: RunsConfig) -> None:
        self.journal = journal
        self.config = config
        self._uploading = 0  # uploads under way (each holds up to max_file_bytes)
        self.routes = [
            Route("/v1/files", ["GET", "POST"], self._files),
            Route("/v1/files/", ["GET", "DELETE"], self._file, prefix=True),
        ]

    async def _files(self, scope: Scope, receive: Receive, send: Send, _: str) -> None:
        rid = request_id_of(scope)
        journal = self.journal
        try:
            if scope["method"] == "GET":
                await respond(scope, send, 200, await self._list(query_of(scope)), rid)
                return
            if self._uploading >= MAX_UPLOADS:
                why = f"{MAX_UPLOADS} uploads are under way; try again"
                raise HttpError(503, "too_many_uploads", why, headers=[(b"retry-after", b"1")])
            self._uploading += 1
            try:  # (the slot held until the bytes are in the store: the bound is on memory)
                data, purpose, filename = await self._upload(scope, receive)
                file = FileRow(
                    id=f"file-{uuid.uuid4().hex}",
                    purpose=purpose,
                    filename=filename,
                    size=len(data),
                    created=journal.now(),
                    data=data,
                )
                await journal.save_file(file)
            finally:
                self._uploading -= 1
        except HttpError as error:
            await send_error(scope, send, error, rid)
            return
        except Disconnected:
            return
        await respond(scope, send, 200, file_body(file), rid)

    async def _upload(self, scope: Scope, receive: Receive) -> tuple[bytes, str, str]:
        """(bytes, purpose, file name) of an upload (413 past ``max_file_bytes``)."""
        limit = self.config.max_file_bytes
        body = await route_body(scope, receive, limit + 64 * 1024, BODY_S)
        kind = header(scope, b"content-type") or b""
        # (Parsed in a worker thread: a large upload is not the event loop's to parse.)
        purpose, filename, data = await anyio.to_thread.run_sync(_upload, kind, body)
        if len(data) > limit:
            raise HttpError(
                413,
                "too_large",
                f"the file is {len(data)} bytes, over [runs] max_file_bytes ({limit})",
                path="file",
            )
        return data, purpose, filename

    async def _list(self, query: dict[str, str]) -> bytes:
        """``GET /v1/files``: ``purpose``'s (all when not given), newest first (``order=asc``:
        oldest), ``limit`` of them (1 to 10,000; 10,000 when not given) after file
        ``after``, paged as OpenAI's list pages them."""
        journal = self.journal
        limit = list_limit(query.get("limit"), _MAX_LIST, _MAX_LIST)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise HttpError(400, "invalid_query", "order must be asc or desc", path="order")
        after = None
        if "after" in query:
            after = await journal.do(journal.file, query["after"])
            if after is None:
                why = f"no file {query['after']!r} to go on from"
                raise HttpError(400, "invalid_query", why, path="after")
        files = await journal.do(
            journal.files,
            purpose=query.get("purpose"),
            limit=limit + 1,
            after=after,
            oldest_first=order == "asc",
        )
        more, files = len(files) > limit, files[:limit]
        data = b",".join(file_body(f) for f in files)
        ends = _encode(
            {
                "first_id": files[0].id if files else None,
                "last_id": files[-1].id if files else None,
                "has_more": more,
            }
        )
        return b'{"object":"list","data":[%s],%s' % (data, ends[1:])

    async def _file(self, scope: Scope, receive: Receive, send: Send, rest: str) -> None:
        rid = request_id_of(scope)
        file_id, _, tail = rest.partition("/")
        journal = self.journal
        deleting = scope["method"] == "DELETE"
        if tail not in ("", "content") or (tail and deleting):
            error = HttpError(404, "not_found", f"no route {scope['method']} {scope['path']}")
            await send_error(scope, send, error, rid)
            return
        file = await journal.do(journal.file, file_id)
        if file is None:
            await send_error(scope, send, _no_file(file_id), rid)
        elif deleting:
            await journal.drop_file(file_id)
            body = _encode({"id": file_id, "object": "file", "deleted": True})
            await respond(scope, send, 200, body, rid)
        elif tail == "content":
            # Held against the bound of large answers before it is read: clients asking
            # for a large file at once cannot make the frontend read it for each.
            with holding(file.size):
                file = await journal.load_file(file_id)
                if file is None or file.data is None:  # (deleted meanwhile)
                    await send_error(scope, send, _no_file(file_id), rid)
                    return
                octets = b"application/octet-stream"
                await respond(scope, send, 200, file.data, rid, octets, held=True)
        else:
            await respond(scope, send, 200, file_body(file), rid)


def _no_file(file_id: str) -> HttpError:
    return HttpError(404, "not_found", f"no file {file_id!r}")


def file_body(file: FileRow) -> bytes:
    """A file as the Files API gives it."""
    return _encode(
        {
            "id": file.id,
            "object": "file",
            "bytes": file.size,
            "created_at": int(file.created),
            "filename": file.filename,
            "purpose": file.purpose,
            "status": "processed",
        }
    )


def _upload(content_type: bytes, body: bytes) -> tuple[str, str, bytes]:
    """(purpose, file name, bytes) of a ``multipart/form-data`` upload; 400 naming what
    is missing."""
    fields = _form_fields(content_type, body)
    if "file" not in fields:
        raise HttpError(400, "invalid_request", "no 'file' field in the upload", path="file")
    purpose = fields.get("purpose", (None, b""))[1].decode(errors="replace")
    if purpose != "batch":
        why = f"purpose {purpose!r}: files are kept for batches ('batch') only"
        raise HttpError(400, "invalid_request", why, path="purpose")
    filename, data = fields["file"]
    return purpose, filename or "upload.jsonl", data


_PART_HEAD_BYTES = 16 * 1024  # a part's headers, at most
_HEADERS = email.parser.BytesHeaderParser(policy=email.policy.HTTP)


def _form_fields(content_type: bytes, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """A ``multipart/form-data`` body's fields (RFC 7578): name -> (file name, bytes).
    The parts are found with ``bytes.find`` and their bytes sliced out (a 48 MB upload:
    tens of milliseconds, where a whole-message parser took 0.7 s of the interpreter);
    only each part's headers go through the email package."""
    if not content_type.lower().startswith(b"multipart/form-data"):
        why = "upload the file as multipart/form-data (fields 'file' and 'purpose')"
        raise HttpError(400, "invalid_request", why)
    boundary = _HEADERS.parsebytes(b"Content-Type: " + content_type + b"\r\n\r\n").get_boundary()
    if not boundary:
        raise HttpError(400, "invalid_request", "the multipart/form-data upload names no boundary")
    delimiter = b"\r\n--" + boundary.encode("latin-1")
    fields: dict[str, tuple[str | None, bytes]] = {}
    at = body.find(delimiter[2:])  # (the first may open the body, without the CRLF)
    while at >= 0 and not body.startswith(b"--", at + len(delimiter) - 2):
        line_end = body.find(b"\r\n", at)  # (the delimiter's line: padding may follow it)
        head_end = body.find(b"\r\n\r\n", line_end) if line_end >= 0 else -1
        head_start = line_end + 2
        end = body.find(delimiter, head_end + 4) if head_end >= 0 else -1
        if head_end - head_start > _PART_HEAD_BYTES:
            why = f"a part's headers are over {_PART_HEAD_BYTES // 1024} KiB"
            raise HttpError(400, "invalid_request", why)
        if end < 0:
            raise HttpError(400, "invalid_request", "the multipart/form-data upload is cut short")
        headers = _HEADERS.parsebytes(body[head_start : head_end + 4])
        coding = str(headers.get("content-transfer-encoding", "binary")).lower()
        if coding not in ("binary", "8bit", "7bit"):
            why = f"a part sent as {coding!r}: send the file's bytes as they are"
            raise HttpError(400, "invalid_request", why)
        name = headers.get_param("name", header="content-disposition")
        if isinstance(name, str):
            fields[name] = (headers.get_filename(), body[head_end + 4 : end])
        at = end + 2
    return fields
