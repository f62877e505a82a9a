"""Multipart form bodies (OpenAI's audio uploads) read from the bytes the gateway already holds.

`form_field` reads one text field without consuming the request (a local engine gets the body unchanged).
`form_parts` then `with_field` build the same form with one text field replaced: a remote must see its own
name for the model in the `model` field. Files keep their bytes, filename and content type; text fields
keep their text.
"""

from __future__ import annotations

import codecs
import email.parser
import email.policy
from dataclasses import dataclass

import aiohttp

from app.core.errors import BadRequestError


@dataclass(frozen=True)
class FormPart:
    name: str
    data: bytes
    filename: str | None  # a file part; None for a text field
    content_type: str | None  # as sent; None when the part had no Content-Type header
    charset: str


def _read(raw: bytes, content_type: str) -> list[FormPart] | None:
    """Every named part of a multipart/form-data body, in order; None when the body is not one."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
    if not msg.is_multipart():
        return None
    out = []
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if not isinstance(name, str) or not isinstance(payload, bytes):
            continue  # an unnamed or nested part is no form field: OpenAI's servers ignore it too
        out.append(
            FormPart(
                name=name,
                data=payload,
                filename=part.get_filename(),
                content_type=str(part["content-type"]) if part["content-type"] else None,
                charset=_charset(part.get_content_charset()),
            )
        )
    return out


def _charset(name: str | None) -> str:
    """The part's charset when Python knows it; utf-8 otherwise (text is decoded with errors replaced)."""
    try:
        return codecs.lookup(name).name if name else "utf-8"
    except (LookupError, ValueError):
        return "utf-8"


def form_parts(raw: bytes, content_type: str) -> list[FormPart]:
    """Every named part of a multipart/form-data body, in order; a body that is not one is a 400."""
    parts = _read(raw, content_type)
    if parts is None:
        raise BadRequestError(
            "send multipart/form-data with `file` and `model` fields (OpenAI's upload shape)"
        )
    return parts


def form_field(raw: bytes, content_type: str, name: str) -> str | None:
    """One text field of a multipart body, or None when there is no such text field (or no form)."""
    for part in _read(raw, content_type) or ():
        if part.name == name and part.filename is None:
            return part.data.decode(part.charset, errors="replace").strip()
    return None


async def with_field(parts: list[FormPart], *, name: str, value: str) -> tuple[bytes, str]:
    """(body, content type) of the same form with text field `name` set to `value` (added if missing)."""
    # quote_fields off: a filename goes as sent, not percent-encoded (servers do not decode it back)
    form = aiohttp.FormData(default_to_multipart=True, quote_fields=False)
    replaced = False
    for part in parts:
        if part.filename is not None:
            ctype = part.content_type or "application/octet-stream"
            form.add_field(part.name, part.data, filename=part.filename, content_type=ctype)
        elif part.name == name:
            if not replaced:
                form.add_field(name, value)
            replaced = True
        else:
            form.add_field(part.name, part.data.decode(part.charset, errors="replace"))
    if not replaced:
        form.add_field(name, value)
    writer = form()
    return await writer.as_bytes(), writer.content_type
