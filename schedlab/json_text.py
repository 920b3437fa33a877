"""JSON text as users' files hold it: one document or several one after another (``vllm bench
serve --append-result`` appends each run's to the same file), and the failures ``json`` raises
besides a syntax error (nesting deeper than the recursion limit, a number of more than 4,300
digits), so that every reader names them in one line instead of a traceback."""

from __future__ import annotations

import json
import sys

_BLANK = " \t\r\n"
#: UTF-16's byte-order marks (what Windows PowerShell 5's ``>`` and ``Out-File`` write)
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
#: what to say of such a file
UTF16_ADVICE = ("not UTF-8 text (it looks like UTF-16, e.g. from PowerShell's >: save it as UTF-8, e.g. with "
                "Out-File -Encoding utf8)")


def looks_utf16(raw: bytes) -> bool:
    """Whether ``raw`` is UTF-16 text: a byte-order mark, or every other byte of its start 0."""
    head = raw[:1024]
    return raw.startswith(UTF16_BOMS) or (len(head) > 1 and (not any(head[0::2]) or not any(head[1::2])))


class JsonTextError(ValueError):
    """Text that is not JSON.

    :ivar reason: what is wrong, e.g. ``Expecting value``.
    :ivar document: the document (1, 2, ...) it is in.
    :ivar line: its line in the text (None: not a syntax error).
    :ivar column: its column in that line (None: not a syntax error).
    :ivar complete: the documents read whole before it (a file of appended runs whose last was cut
        short still holds the runs before it).
    """

    def __init__(self, reason: str, document: int, line: int | None, column: int | None = None,
                 complete: tuple = ()):
        super().__init__(reason)
        self.reason, self.document, self.line, self.column = reason, document, line, column
        self.complete = complete

    @property
    def where(self) -> str:
        """``reason`` and where in the text, as ``json`` says it (``Unterminated string starting at:
        line 1 column 204``): a file cut short says where it stops."""
        if self.line is None:
            return self.reason
        return f"{self.reason}: line {self.line}" + (f" column {self.column}" if self.column is not None else "")

    @property
    def detail(self) -> str:
        """:attr:`where`, preceded by the document when the text held documents before it."""
        if self.document == 1:
            return self.where
        return f"document {self.document}: {self.where}"


def unreadable_json(exc: BaseException) -> str:
    """What stopped ``json.loads`` other than a syntax error (a JSONDecodeError says that):
    nesting deeper than Python's recursion limit lets it follow (about 1,000 levels), or a whole
    number longer than Python converts from text (4,300 digits)."""
    if isinstance(exc, RecursionError):
        return "lists or objects nested too deeply to read"
    return f"a number too long to read (more than {sys.get_int_max_str_digits()} digits)"


def json_documents(text: str, duplicates: list | None = None) -> list:
    """Every JSON document in ``text``, in order (separated by whitespace or by nothing). With
    ``duplicates`` (a list), each key an object holds twice is appended to it (``json`` keeps the
    last value silently: an edited or joined file).

    :raises JsonTextError: text that is empty or not JSON, naming the document it failed in.
    """
    decoder = json.JSONDecoder() if duplicates is None else json.JSONDecoder(object_pairs_hook=_noting(duplicates))
    documents: list = []
    at = 0
    while True:
        while at < len(text) and text[at] in _BLANK:
            at += 1
        if at == len(text) and documents:
            return documents
        try:
            document, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise JsonTextError(exc.msg, len(documents) + 1, exc.lineno, exc.colno, tuple(documents)) from None
        except (ValueError, RecursionError) as exc:
            raise JsonTextError(unreadable_json(exc), len(documents) + 1, None, None, tuple(documents)) from None
        documents.append(document)


def documents_before_break(exc: JsonTextError, index: int | None) -> list | None:
    """The documents to read when document ``exc.document`` is broken but the one asked for,
    ``index`` (0-based; None: the last), was read whole before it -- else None. A run killed while
    ``vllm bench serve --append-result`` wrote its result leaves the runs before it readable."""
    if index is None or not 0 <= index < len(exc.complete):
        return None
    return list(exc.complete)


def cut_short_note(exc: JsonTextError, index: int) -> str:
    """What to say when document ``index`` is read from a file whose document ``exc.document`` is
    broken."""
    return (f"document {exc.document} is not JSON ({exc.where}: a run cut short?); reading document index "
            f"{index}, one of the {len(exc.complete)} before it")


def _noting(duplicates: list):
    """An ``object_pairs_hook`` that builds the dict as ``json`` does and notes keys given twice."""
    def hook(pairs):
        built = dict(pairs)
        if len(built) < len(pairs):
            seen: set = set()
            duplicates.extend(k for k, _ in pairs if k in seen or seen.add(k))
        return built
    return hook
