"""The S3 answer readers (``storage/s3/answers.py``): what servers send, and the two
ListObjectsV2 parsers (the string scanner and ElementTree) reading the same on any
listing: keys with XML's special characters written as entities or character
references, unicode, url encoding, owners, pretty-printing, common prefixes,
truncation and continuation tokens."""

from __future__ import annotations

import random
from urllib.parse import quote_plus

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pawn_queue_sync.storage.s3.answers import (
    Answer,
    _parse_list,
    _scan_list,
    delete_errors,
    error_of,
    list_page,
)

# -- the answer parsers, on what servers send --------------------------------------------


def test_parsers_read_what_servers_send() -> None:
    page = list_page(
        b'<?xml version="1.0" encoding="UTF-8"?>'
        b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<Name>b</Name><Prefix>t%2F</Prefix><EncodingType>url</EncodingType>"
        b"<IsTruncated>true</IsTruncated><NextContinuationToken>tok%2B</NextContinuationToken>"
        b"<Contents><Key>t/a%20b</Key><LastModified>2026-11-26T01:02:03.000Z</LastModified>"
        b"<ETag>&quot;abc&quot;</ETag><Size>7</Size></Contents>"
        b"<CommonPrefixes><Prefix>t/d%2Be/</Prefix></CommonPrefixes>"
        b"</ListBucketResult>"
    )
    assert page.rows == [("t/a b", '"abc"', 7, "2026-11-26T01:02:03.000Z")]
    assert page.prefixes == ["t/d+e/"]
    assert page.token == "tok%2B"  # opaque: sent back as it came
    assert list_page(b"<ListBucketResult><IsTruncated>false</IsTruncated>"
                     b"<NextContinuationToken>x</NextContinuationToken>"
                     b"</ListBucketResult>").token is None
    assert delete_errors(
        b"<DeleteResult><Error><Key>k1</Key><Code>AccessDenied</Code></Error>"
        b"<Deleted><Key>k2</Key></Deleted></DeleteResult>"
    ) == [("k1", "AccessDenied")]
    assert error_of(Answer(412, {}, b"<Error><Code>PreconditionFailed</Code>"
                                    b"<Message>no</Message></Error>")) == (
        "PreconditionFailed", "no")
    assert error_of(Answer(404, {}, b"")) == ("404", "")
    with pytest.raises(ValueError):
        list_page(b"<html>not s3</html")


def test_unusual_listings_go_to_elementtree() -> None:
    cdata = (b"<ListBucketResult><IsTruncated>false</IsTruncated><Contents>"
             b"<Key><![CDATA[a<b]]></Key><ETag>e</ETag><Size>1</Size></Contents>"
             b"</ListBucketResult>")
    prefixed = (b'<s3:ListBucketResult xmlns:s3="http://s3.amazonaws.com/doc/2006-03-01/">'
                b"<s3:Contents><s3:Key>k</s3:Key><s3:Size>1</s3:Size></s3:Contents>"
                b"</s3:ListBucketResult>")
    for body, key in ((cdata, "a<b"), (prefixed, "k")):
        assert _scan_list(body) is None
        assert list_page(body).rows[0][0] == key


# -- any listing, written in any of XML's spellings ----------------------------------------

#: the ways XML may spell each special character in text (a raw '>', '"' or "'" is
#: allowed there; '&' and '<' never are)
_SPELLINGS = {
    "&": ("&amp;", "&#38;", "&#x26;"),
    "<": ("&lt;", "&#60;", "&#x3C;"),
    ">": (">", "&gt;", "&#62;"),
    '"': ('"', "&quot;", "&#34;", "&#x22;"),
    "'": ("'", "&apos;", "&#39;"),
}


def _xml_text(text: str, rnd: random.Random) -> str:
    """``text`` as XML character data, each special character in a spelling picked at
    random, and now and then a non-ASCII one as a character reference."""
    out = []
    for ch in text:
        if ch in _SPELLINGS:
            out.append(rnd.choice(_SPELLINGS[ch]))
        elif ord(ch) > 127 and rnd.random() < 0.3:
            out.append(f"&#{ord(ch)};" if rnd.random() < 0.5 else f"&#x{ord(ch):x};")
        else:
            out.append(ch)
    return "".join(out)


_ANY_TEXT = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Cn")) | st.sampled_from("&<>\"'%+ /"),
    min_size=1, max_size=40,
)


@st.composite
def spelled_listings(draw: st.DrawFn) -> tuple[bytes, list[tuple[str, str, int]],
                                                 list[str], str | None]:
    """A ListObjectsV2 answer and what it says: its rows (key, etag, size), its common
    prefixes, and its continuation token (None unless truncated)."""
    rnd = draw(st.randoms(use_true_random=False))
    encoded = draw(st.booleans())
    enc = (lambda k: quote_plus(k, safe="/")) if encoded else (lambda k: k)
    nl = "\n  " if draw(st.booleans()) else ""
    rows = draw(st.lists(st.tuples(_ANY_TEXT, st.text('0123456789abcdef"-', max_size=34),
                                   st.integers(0, 10**12)), max_size=8))
    rows = [(key, f'"{etag}"' if draw(st.booleans()) else etag, size) for key, etag, size in rows]
    prefixes = [p + "/" for p in draw(st.lists(_ANY_TEXT, max_size=3))]
    truncated = draw(st.booleans())
    token = draw(_ANY_TEXT.filter(lambda t: t.strip() == t))
    parts = ['<?xml version="1.0" encoding="UTF-8"?>',
             '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
             f"{nl}<Name>b</Name><Prefix>{_xml_text(enc('t/'), rnd)}</Prefix>"]
    if draw(st.booleans()):
        parts.append(f"<StartAfter>{_xml_text(enc(draw(_ANY_TEXT)), rnd)}</StartAfter>")
    if draw(st.booleans()):
        parts.append(f"<ContinuationToken>{_xml_text(draw(_ANY_TEXT), rnd)}</ContinuationToken>")
    parts.append(f"<KeyCount>{len(rows)}</KeyCount><MaxKeys>1000</MaxKeys>")
    if prefixes:
        parts.append("<Delimiter>/</Delimiter>")
    if encoded:
        parts.append("<EncodingType>url</EncodingType>")
    parts.append(f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>")
    if truncated or draw(st.booleans()):  # a token with IsTruncated false means nothing
        parts.append(f"<NextContinuationToken>{_xml_text(token, rnd)}</NextContinuationToken>")
    for key, etag, size in rows:
        owner = "<Owner><ID>o</ID><DisplayName>d</DisplayName></Owner>" if size % 2 else ""
        parts.append(
            f"{nl}<Contents>{nl}<Key>{_xml_text(enc(key), rnd)}</Key>"
            f"<LastModified>2026-11-26T01:02:03.000Z</LastModified>"
            f"<ETag>{_xml_text(etag, rnd)}</ETag><Size>{size}</Size>{owner}"
            f"<StorageClass>STANDARD</StorageClass></Contents>"
        )
    for prefix in prefixes:
        parts.append(f"<CommonPrefixes><Prefix>{_xml_text(enc(prefix), rnd)}</Prefix>"
                     "</CommonPrefixes>")
    parts.append("</ListBucketResult>")
    return ("".join(parts).encode("utf-8"), rows, prefixes, token if truncated else None)


@settings(max_examples=500, deadline=None)
@given(spelled_listings())
def test_both_parsers_read_what_any_listing_says(
    case: tuple[bytes, list[tuple[str, str, int]], list[str], str | None],
) -> None:
    """The scanner takes every plain answer (no CDATA, no comments), reads exactly what
    ElementTree reads, and the page is what the answer says."""
    body, rows, prefixes, token = case
    scanned = _scan_list(body)
    assert scanned is not None
    assert scanned == _parse_list(body)
    page = list_page(body)
    assert [(k, e, s) for k, e, s, _ in page.rows] == rows
    assert page.prefixes == prefixes
    assert page.token == token
