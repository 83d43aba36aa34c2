"""Reading S3's XML answers: ListObjectsV2 pages (two parsers: a string scanner for the
plain answers servers send, ElementTree for anything else; they read the same, as a
property test checks), DeleteObjects failures and error codes."""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import unquote_plus

import attrs

__all__ = ["Answer", "Page", "delete_errors", "error_of", "list_page"]


@attrs.frozen
class Answer:
    """An HTTP answer: status, lower-cased headers, body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _xml(body: bytes) -> ET.Element | None:
    try:
        return ET.fromstring(body)
    except ET.ParseError:
        return None


def error_of(answer: Answer) -> tuple[str, str]:
    """(code, message) of an error answer; the status when the body says nothing
    (HEAD answers have no body)."""
    root = _xml(answer.body) if answer.body else None
    code = message = ""
    if root is not None:
        for child in root:
            name = _local(child.tag)
            if name == "Code":
                code = child.text or ""
            elif name == "Message":
                message = child.text or ""
    return code or str(answer.status), message


@attrs.frozen
class Page:
    """One ListObjectsV2 page: (key, etag, size, last modified) rows, common prefixes,
    the continuation token when more remain."""

    rows: list[tuple[str, str, int, Any]]
    prefixes: list[str]
    token: str | None


_ROW_TAGS = tuple((f"<{n}>", f"</{n}>") for n in ("Key", "ETag", "Size", "LastModified"))


def _element(text: str, tags: tuple[str, str]) -> str | None:
    """The text of the first ``<Name>...</Name>`` in ``text``; None if absent or not
    plain text (a nested element or an unclosed tag)."""
    opening, closing = tags
    start = text.find(opening)
    if start < 0:
        return None
    start += len(opening)
    end = text.find(closing, start)
    if end < 0 or "<" in text[start:end]:
        return None
    return text[start:end]


def list_page(body: bytes) -> Page:
    """Parse a ListObjectsV2 answer sent with ``encoding-type=url``.

    The plain answers S3 servers send are scanned with regular expressions (a third of
    ElementTree's CPU: listings are what a poll parses most); anything unusual (CDATA,
    comments, namespace prefixes, a count that does not add up) goes to ElementTree."""
    page = _scan_list(body)
    if page is None:
        page = _parse_list(body)
    rows, prefixes, token, encoded = page
    if encoded:
        rows = [(_decoded(k), e, s, m) for k, e, s, m in rows]
        prefixes = [_decoded(p) for p in prefixes]
    return Page(rows, prefixes, token)


def _decoded(value: str) -> str:
    """A url-encoded key or prefix, decoded as botocore does (a space arrives as "+")."""
    return unquote_plus(value) if "%" in value or "+" in value else value


_Parsed = tuple[list[tuple[str, str, int, Any]], list[str], "str | None", bool]


def _scan_list(body: bytes) -> _Parsed | None:
    """The fast reading of :func:`list_page`; None where it cannot be sure."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "<!" in text or "<ListBucketResult" not in text or ":Contents" in text:
        return None
    head, *blocks = text.split("<Contents>")
    rest = [head]
    rows: list[tuple[str, str, int, Any]] = []
    for chunk in blocks:
        block, found, tail = chunk.partition("</Contents>")
        key = _element(block, _ROW_TAGS[0])
        if not found or key is None:
            return None
        etag, size, modified = (_element(block, tags) for tags in _ROW_TAGS[1:])
        rows.append((_text(key), _text(etag or ""), int(size or 0), modified or ""))
        rest.append(tail)
    top = "".join(rest)
    prefixes: list[str] = []
    head, *blocks = top.split("<CommonPrefixes>")
    rest = [head]
    for chunk in blocks:
        block, found, tail = chunk.partition("</CommonPrefixes>")
        prefix = _element(block, ("<Prefix>", "</Prefix>"))
        if not found or prefix is None:
            return None
        prefixes.append(_text(prefix))
        rest.append(tail)
    top = "".join(rest)
    truncated = (_element(top, _IS_TRUNCATED) or "").strip().lower() == "true"
    token = _element(top, _NEXT_TOKEN)
    encoded = (_element(top, _ENCODING) or "").strip().lower() == "url"
    return rows, prefixes, (_text(token) if truncated and token else None), encoded


_IS_TRUNCATED = ("<IsTruncated>", "</IsTruncated>")
_NEXT_TOKEN = ("<NextContinuationToken>", "</NextContinuationToken>")
_ENCODING = ("<EncodingType>", "</EncodingType>")


def _text(value: str) -> str:
    """XML character data: the predefined entities and character references (quoted
    ETags are the common case: a replace or two; SeaweedFS writes the quote as &#34;)."""
    if "&" not in value:
        return value
    plain = value.replace("&quot;", '"').replace("&#34;", '"')
    return html.unescape(value) if "&" in plain else plain


def _parse_list(body: bytes) -> _Parsed:
    """ElementTree's reading of :func:`list_page`."""
    root = _xml(body)
    if root is None:
        raise ValueError("unreadable ListObjectsV2 answer")
    rows: list[tuple[str, str, int, Any]] = []
    prefixes: list[str] = []
    token: str | None = None
    truncated = False
    encoded = False
    for child in root:
        name = _local(child.tag)
        if name == "Contents":
            fields = {_local(f.tag): f.text or "" for f in child}
            rows.append(
                (fields.get("Key", ""), fields.get("ETag", ""), int(fields.get("Size") or 0),
                 fields.get("LastModified", ""))
            )
        elif name == "CommonPrefixes":
            prefixes.extend(f.text or "" for f in child if _local(f.tag) == "Prefix")
        elif name == "NextContinuationToken":
            token = child.text
        elif name == "IsTruncated":
            truncated = (child.text or "").strip().lower() == "true"
        elif name == "EncodingType":
            encoded = (child.text or "").strip().lower() == "url"
    return rows, prefixes, (token if truncated else None), encoded


def delete_errors(body: bytes) -> list[tuple[str, str]]:
    """(key, code) of every failure a DeleteObjects answer lists."""
    root = _xml(body)
    if root is None:
        raise ValueError("unreadable DeleteObjects answer")
    out: list[tuple[str, str]] = []
    for child in root:
        if _local(child.tag) == "Error":
            fields = {_local(f.tag): f.text or "" for f in child}
            out.append((fields.get("Key", ""), fields.get("Code", "")))
    return out
