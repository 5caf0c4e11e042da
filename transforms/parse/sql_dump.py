"""Reading MediaWiki SQL table dumps (mysqldump files: page, redirect, page_props), streaming, row by row."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator
from typing import Any

from artifacts import fs
from artifacts.errors import InputError

_CREATE = re.compile(r"CREATE TABLE `([^`]+)`")
_COLUMN = re.compile(r"^\s*`([^`]+)`\s")
_INSERT = re.compile(r"^INSERT INTO `([^`]+)` VALUES ")
# One value followed by its separator: a quoted string (backslash escapes), NULL, or a number.
_VALUE = re.compile(r"\s*(?:'((?:[^'\\]|\\.)*)'|(NULL)|([-+0-9.eE]+))\s*([,)])", re.S)
_ESCAPES = {"0": "\0", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "b": "\b"}
_ESCAPE = re.compile(r"\\(.)", re.S)


class SqlSyntaxError(ValueError):
    """An INSERT statement this reader cannot parse."""


def unescape(value: str) -> str:
    """A MySQL string literal's content without its backslash escapes."""
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda match: _ESCAPES.get(match.group(1), match.group(1)), value)


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def parse_values(statement: str, start: int) -> Iterator[list[Any]]:
    """The rows of ``VALUES (...),(...);`` starting at ``statement[start]``."""
    position = start
    length = len(statement)
    while position < length:
        if statement[position] != "(":
            raise SqlSyntaxError(f"expected '(' at character {position}")
        position += 1
        row: list[Any] = []
        while True:
            match = _VALUE.match(statement, position)
            if match is None:
                raise SqlSyntaxError(f"unparsable value at character {position}")
            quoted, null, number, separator = match.groups()
            row.append(unescape(quoted) if quoted is not None else None if null else _number(number))
            position = match.end()
            if separator == ")":
                break
        yield row
        if position < length and statement[position] == ",":
            position += 1
        elif position < length and statement[position] == ";":
            # Some dumps put several INSERT statements on one line.
            following = _INSERT.match(statement[position + 1 :].lstrip())
            if following is None:
                return
            rest = statement[position + 1 :].lstrip()
            statement, position, length = rest, following.end(), len(rest)
        while position < length and statement[position] in " \n\r":
            position += 1


def iter_sql_rows(path: str, on_bad_statement: Callable[[int, str], None] | None = None) -> Iterator[dict[str, Any]]:
    """Every row of a table dump (.sql or .sql.gz) as {column: value}, columns named by its CREATE TABLE.

    An INSERT statement that cannot be parsed raises an InputError naming the file and line, or, given
    ``on_bad_statement(line_number, reason)``, is reported there and skipped whole (none of its rows is kept).
    Memory holds one line (one INSERT statement, ~1 MB in Wikimedia dumps) at a time.
    """
    columns: list[str] = []
    in_create = False
    with fs.open_decompressed(path) as raw:
        lines = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="\n")
        try:
            for number, line in enumerate(lines, start=1):
                if in_create:
                    column = _COLUMN.match(line)
                    if column:
                        columns.append(column.group(1))
                    elif line.startswith(")"):
                        in_create = False
                    continue
                if _CREATE.match(line):
                    in_create, columns = True, []
                    continue
                insert = _INSERT.match(line)
                if insert is None:
                    continue
                if not columns:
                    raise InputError(f"{path}: INSERT at line {number} before any CREATE TABLE")
                try:
                    rows = statement_rows(line.rstrip("\n"), insert.end(), columns)
                except SqlSyntaxError as error:
                    if on_bad_statement is None:
                        raise InputError(f"{path}: line {number}: {error}") from error
                    on_bad_statement(number, str(error))
                    continue
                yield from rows
        except fs.ARCHIVE_ERRORS as error:
            raise InputError(f"{path}: truncated or corrupt archive: {error}") from error


# How far into a table dump its CREATE TABLE is looked for (a mysqldump header is a few kB).
HEADER_BYTES = 1 << 20


def table_definition(path: str) -> tuple[str, tuple[str, ...]] | None:
    """The name and columns of the first CREATE TABLE of a table dump; None when its first ``HEADER_BYTES`` hold
    none (not a mysqldump file). An unreadable archive is an InputError."""
    name, columns, read = None, [], 0
    with fs.open_decompressed(path) as raw:
        lines = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="\n")
        try:
            while read < HEADER_BYTES and (line := lines.readline(HEADER_BYTES - read)):
                read += len(line)
                create = _CREATE.match(line)
                if name is None and create:
                    name = create.group(1)
                elif name is not None and (column := _COLUMN.match(line)):
                    columns.append(column.group(1))
                elif (name is not None and line.startswith(")")) or _INSERT.match(line):
                    break
        except fs.ARCHIVE_ERRORS as error:
            raise InputError(f"{path}: truncated or corrupt archive: {error}") from error
    return None if name is None else (name, tuple(columns))


def statement_rows(statement: str, start: int, columns: list[str]) -> list[dict[str, Any]]:
    """All rows of one INSERT statement, parsed whole first so that a bad statement yields none of them."""
    rows = []
    for row in parse_values(statement, start):
        if len(row) != len(columns):
            raise SqlSyntaxError(f"a row of {len(row)} values for {len(columns)} columns")
        rows.append(dict(zip(columns, row, strict=True)))
    return rows
