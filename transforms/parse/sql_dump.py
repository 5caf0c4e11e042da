"""Reading MediaWiki SQL table dumps (mysqldump files: page, redirect, page_props), streaming, row by row."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

from artifacts import fs
from artifacts.errors import InputError

_NAME = r"(?:`([^`]+)`|(\w+))"
_CREATE = re.compile(rf"\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?{_NAME}", re.I)
_COLUMN = re.compile(r"^\s*`([^`]+)`\s")
# mysqldump's INSERT and REPLACE, with --complete-insert's column list, --insert-ignore's IGNORE, any case.
_INSERT = re.compile(rf"\s*(?:INSERT|REPLACE)\s+(?:(?:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE)\s+)*INTO\s+{_NAME}\s*"
                     r"(?:\(([^)]*)\)\s*)?VALUES\s*", re.I)
_STATEMENT_START = re.compile(r"\s*(?:INSERT|REPLACE)\b", re.I)
_LATER_INSERT = re.compile(r";\s*(?=(?:INSERT|REPLACE)\b)", re.I)  # LOCK TABLES `page` WRITE;INSERT INTO ...
# One value: a quoted string (backslash escapes, '' for a quote, an optional charset introducer such as _binary),
# NULL, a number (checked as converted), or a hex literal (X'..', 0x.. of --hex-blob). A string's characters are
# taken in runs, never given back (possessive): the fastest form measured.
_ONE_VALUE = r"""(?:
      (?:_\w+\s*)?'((?:[^'\\]+|\\.|'')*+)'
    | ((?i:NULL))
    | ([-+0-9.eE]+)
    | [xX]'([0-9a-fA-F]*)'
    | 0x([0-9a-fA-F]+)
    )"""
_VALUE = re.compile(rf"\s*{_ONE_VALUE}\s*([,)])", re.S | re.X)  # ... followed by its separator
_SPACE = re.compile(r"\s*")
_ESCAPES = {"0": "\0", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "b": "\b"}
_ESCAPE = re.compile(r"\\(.)|''", re.S)


class SqlSyntaxError(ValueError):
    """A statement of a table dump this reader cannot read, at ``line``."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(reason)
        self.line = line


class SqlRow(NamedTuple):
    """A row of a table dump ({column: value}) and where it is (file, line of its INSERT's row)."""

    values: dict[str, Any]
    path: str
    line: int


def unescape(value: str) -> str:
    """A MySQL string literal's content without its backslash escapes and doubled quotes."""
    if "\\" not in value and "''" not in value:
        return value
    return _ESCAPE.sub(lambda match: "'" if match.group(1) is None else _ESCAPES.get(match.group(1), match.group(1)),
                       value)


def _hex(digits: str) -> str:
    """A hex literal's bytes as text: UTF-8, a byte that is none kept as a lone surrogate (no title holds one)."""
    return bytes.fromhex(digits if len(digits) % 2 == 0 else "0" + digits).decode("utf-8", "surrogateescape")


def _number(text: str) -> int | float:
    """A number as written (ValueError unless it is one: ``2e``, ``1-2``; an integer of more digits than Python
    converts is a float)."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def _values(groups: tuple[str | None, ...]) -> list[Any]:
    """The values of ``_ONE_VALUE``'s groups, five a value (ValueError for a number that is none)."""
    five = iter(groups)
    return [unescape(quoted) if quoted is not None
            else (int(number) if len(number) < 19 and number.isdigit() else _number(number)) if number is not None
            else None if null else _hex(hex_literal if hex_literal is not None else hex_number)
            for quoted, null, number, hex_literal, hex_number in zip(five, five, five, five, five, strict=True)]


def _row_pattern(columns: int) -> re.Pattern[str]:
    """A row of ``columns`` values on one line from its ``(`` to the ``,`` or ``;`` after it (the last group)."""
    return re.compile(r"\s*\(\s*" + r"\s*,\s*".join([_ONE_VALUE] * columns) + r"\s*\)\s*([,;])", re.S | re.X)


class _Statements:
    """The rows of a file's INSERT statements; a statement may span lines (one row or more on each: phpMyAdmin,
    ``mysqldump --extended-insert=false`` joined) and a line may hold several statements. A row lies on one line."""

    def __init__(self, lines: Iterator[tuple[int, str]]) -> None:
        self._lines = lines
        self.text, self.position, self.line = "", 0, 0

    def next_line(self) -> bool:
        numbered = next(self._lines, None)
        if numbered is None:
            return False
        (self.line, self.text), self.position = numbered, 0
        return True

    def skip_space(self) -> None:
        """Past white space to the statement's next character, over line ends (the file ending first is an error)."""
        while True:
            self.position = _SPACE.match(self.text, self.position).end()
            if self.position < len(self.text):
                return
            if not self.next_line():
                raise SqlSyntaxError(self.line, "the file ends inside an INSERT statement (cut short?)")

    def row(self) -> list[Any]:
        """The values of the row at the cursor (past its ``(``), a match a value (``rows`` reads most rows whole)."""
        text, position, match_value, values = self.text, self.position, _VALUE.match, []
        while True:
            match = match_value(text, position)
            if match is None:
                self.position = position
                raise self.unparsable()
            try:
                values.extend(_values(match.groups()[:-1]))
            except ValueError:  # 2e, 1-2
                self.position = position
                raise self.unparsable() from None
            separator, position = match.group(6), match.end()
            if separator == ")":
                self.position = position
                return values

    def unparsable(self) -> SqlSyntaxError:
        """What no value at the cursor means: the file's last line ends inside a row, or a value of no syntax known."""
        if not self.text.endswith("\n"):
            return SqlSyntaxError(self.line, "the file ends inside a row (cut short?)")
        return SqlSyntaxError(self.line, f"unparsable value at character {self.position + 1}: "
                                         f"{self.text[self.position:self.position + 40]!r}")

    def rows(self, columns: int) -> Iterator[tuple[list[Any], int]]:
        """The rows of the statement whose VALUES the cursor is past (of ``columns`` values, as its columns say),
        with their lines; the cursor left past its ``;``. The innermost loop of reading a table (~60M rows of ~10
        values in English Wikipedia's page table): a row of ``columns`` values on one line with the separator after
        it is one match of a pattern made for them (~1.8 times as fast as a match a value); any other row is read
        a value at a time (``row``), which says what is wrong with it."""
        whole_row = _row_pattern(columns)  # compiled once: re keeps it
        while True:
            if match := whole_row.match(self.text, self.position):
                groups = match.groups()
                try:
                    values = _values(groups[:-1])
                except ValueError:  # 2e: read again below, which says where
                    values = None
                if values is not None:
                    self.position = match.end()
                    yield values, self.line
                    if groups[-1] == ";":
                        return
                    continue
            self.skip_space()
            if self.text[self.position] != "(":
                raise SqlSyntaxError(self.line, f"expected '(' at character {self.position + 1}")
            self.position += 1
            line = self.line
            yield self.row(), line
            self.skip_space()
            separator = self.text[self.position]
            self.position += 1
            if separator == ";":
                return
            if separator != ",":
                raise SqlSyntaxError(self.line, f"expected ',' or ';' after a row at character {self.position}")


def _name(match: re.Match[str]) -> str:
    return match.group(1) or match.group(2)


def _create_columns(statements: _Statements) -> list[str]:
    """The columns of the CREATE TABLE whose first line the cursor is on, the cursor left on its last."""
    columns = []
    while statements.next_line():
        column = _COLUMN.match(statements.text)
        if column:
            columns.append(column.group(1))
        elif statements.text.startswith(")"):
            break
    return columns


def _insert_columns(statements: _Statements, insert: re.Match[str], table: str | None, needed: tuple[str, ...],
                    created: dict[str, list[str]]) -> list[str]:
    """The columns of the INSERT ``insert`` matched at the cursor: its own list, else its table's CREATE TABLE."""
    name = _name(insert)
    if table is not None and name != table:
        raise SqlSyntaxError(statements.line, f"rows of the {name} table in a dump read as the {table} table")
    if insert.group(3) is not None:
        columns = [column.strip().strip("`") for column in insert.group(3).split(",")]
    elif name in created:
        columns = created[name]
    else:
        raise SqlSyntaxError(statements.line, f"an INSERT into {name} before its CREATE TABLE")
    missing = [column for column in needed if column not in columns]
    if missing:
        raise SqlSyntaxError(statements.line, f"an INSERT into {name} without the column {', '.join(missing)}")
    return columns


def _insert_at_cursor(statements: _Statements) -> re.Match[str] | None:
    """The INSERT statement's start at the cursor; None where no statement starts (an INSERT of a form this reader
    does not know is an error: its rows would be lost without a word)."""
    insert = _INSERT.match(statements.text, statements.position)
    if insert is None and _STATEMENT_START.match(statements.text, statements.position):
        start = statements.text[statements.position:statements.position + 60].strip()
        raise SqlSyntaxError(statements.line, f"an INSERT of a form this reader does not know: {start!r}")
    return insert


def _table_rows(path: str, statements: _Statements, table: str | None, needed: tuple[str, ...]) -> Iterator[SqlRow]:
    created: dict[str, list[str]] = {}
    while statements.next_line():
        create = _CREATE.match(statements.text)
        if create:
            created[_name(create)] = _create_columns(statements)
            continue
        insert = _insert_at_cursor(statements)
        if insert is None and (later := _LATER_INSERT.search(statements.text)):  # after a statement of another kind
            statements.position = later.end()
            insert = _insert_at_cursor(statements)
        while insert is not None:  # some dumps put several INSERT statements on one line
            statements.position = insert.end()
            columns = _insert_columns(statements, insert, table, needed, created)
            for values, line in statements.rows(len(columns)):
                if len(values) != len(columns):
                    raise SqlSyntaxError(line, f"a row of {len(values)} values for {len(columns)} columns")
                yield SqlRow(dict(zip(columns, values, strict=True)), path, line)
            insert = _insert_at_cursor(statements)


def iter_sql_rows(path: str, table: str | None = None, needed: tuple[str, ...] = ()) -> Iterator[SqlRow]:
    """Every row of a table dump (.sql or .sql.gz), columns named by its INSERT's list or its CREATE TABLE.

    ``table``: the table the file must hold (rows of another are an error); ``needed``: the columns each INSERT
    must give. A statement this reader cannot read (a
    value of no SQL syntax it knows, a row of the wrong length, a file cut inside a statement) is an InputError
    naming the file and line. Text that is not UTF-8 is read byte for byte as lone surrogates (which no title
    holds). Memory holds one line (one INSERT statement, ~1 MB in Wikimedia dumps) at a time.
    """
    with fs.open_decompressed(path) as raw:
        lines = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline="\n")
        try:
            yield from _table_rows(path, _Statements(enumerate(lines, start=1)), table, needed)
        except SqlSyntaxError as error:
            raise InputError(f"{path}: line {error.line}: {error}") from error
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
                    name = _name(create)
                elif name is not None and (column := _COLUMN.match(line)):
                    columns.append(column.group(1))
                elif (name is not None and line.startswith(")")) or _STATEMENT_START.match(line):
                    break
        except fs.ARCHIVE_ERRORS as error:
            raise InputError(f"{path}: truncated or corrupt archive: {error}") from error
    return None if name is None else (name, tuple(columns))
