"""Reading, finding and writing Python sources, shared by accel-convert and accel-lint.

A source keeps the encoding it came in (PEP 263 cookie or BOM) so it can be written back byte for
byte outside the edited spots; every failure is a :class:`SourceError` that prints as one
``path:line: message`` line, and a file the tools leave alone on purpose is a :class:`Skipped`.
"""

from __future__ import annotations

import codecs
import io
import os
import re
import stat
import subprocess
import sys
import tempfile
import threading
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ast

STDIN = "-"
STDIN_NAME = "<stdin>"  # the path reports give standard input

# Folders no one wants walked even outside a git checkout (hidden ones are always skipped).
_SKIPPED_DIRS = frozenset(
    {"__pycache__", "node_modules", "venv", "site-packages", "build", "dist", "__pypackages__"}
)


class SourceError(Exception):
    """A file that cannot be read, decoded, parsed or written; ``str()`` is the one-line report."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path, self.line, self.message = path, line, message

    def __reduce__(self) -> tuple[type[SourceError], tuple[str, int, str]]:
        # Worker processes send errors back pickled; the default would call __init__ with one arg.
        return type(self), (self.path, self.line, self.message)


class Skipped(SourceError):
    """A well-formed file that is not the tools' to read (a notebook in another language): one
    line like an error's, but a note, not a failure. Exiting 2 would fail every CI run of a
    repository that also holds R notebooks, and nothing in the file is wrong."""


# CPython before 3.12 keeps the AST builder's recursion depth in interpreter-wide state: two
# threads building ASTs at once fail with "SystemError: AST constructor recursion depth
# mismatch" (python/cpython#106905). Library users convert from threads; one at a time is cheap.
# Parses outside this module (3.11's traceback formatting parses the failing line to place its
# carets) cannot take the lock: a parse they spoil is run again, as the state resets each time.
_AST_LOCK = threading.Lock()
_SPOILED = "AST constructor recursion depth mismatch"
_ATTEMPTS = 5


def python_ast(text: str, path: str = "<unknown>") -> ast.Module:
    """``ast.parse``, safe to call from several threads."""
    import ast  # only here: the tools' start-up does not pay for it

    with _AST_LOCK:
        for _ in range(_ATTEMPTS - 1):
            try:
                return ast.parse(text, path)
            except SystemError as err:
                if _SPOILED not in str(err):
                    raise
        return ast.parse(text, path)


def python_syntax_error(text: str, path: str) -> SyntaxError | None:
    """CPython's ``SyntaxError`` for ``text``, or None when it parses. Raised at once for nesting
    beyond Python's limits, which libcst's native parser would crash on (SIGSEGV)."""
    try:
        tree = python_ast(text, path)
    except SyntaxError as err:
        if "too many" in (err.msg or ""):  # nested parentheses, indentation levels, ...
            raise
        return err
    except RecursionError:  # building the AST: thousands of ``.attr`` or unary terms
        raise SyntaxError(
            "nested too deeply to parse", (path, _longest_line(text), 0, "")
        ) from None
    except MemoryError:  # CPython's parser overflows its stack (thousands of unary operators)
        message = "too complex for Python's parser (nested too deeply; split this expression)"
        raise SyntaxError(message, (path, _longest_line(text), 0, "")) from None
    _refuse_long_bool_chains(tree, text, path)
    return None


# CPython keeps ``a and b and ...`` flat; libcst nests it a level per operator, and its native
# parser overflows its stack (SIGSEGV) between 5,000 and 10,000 terms. Nesting beyond this is
# refused everywhere else by CPython itself, at about the same depth.
_LONGEST_BOOL_CHAIN = 2_990


def _refuse_long_bool_chains(tree: ast.Module, text: str, path: str) -> None:
    if len(re.findall(r"\b(?:and|or)\b", text)) < _LONGEST_BOOL_CHAIN:
        return  # no chain can be that long: the common case costs one scan of the text
    import ast  # only on this rare path

    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp) and len(node.values) > _LONGEST_BOOL_CHAIN:
            raise SyntaxError(
                f"an and/or chain of {len(node.values):,} terms is too long for libcst, which "
                f"the tools read code with (it nests one level per term; at most "
                f"{_LONGEST_BOOL_CHAIN:,}): split it",
                (path, node.lineno, 0, ""),
            )


def _longest_line(text: str) -> int:
    """Where an overflow most likely is: neither error says, and such code is one long line."""
    lines = text.splitlines() or [""]
    return max(range(len(lines)), key=lambda i: len(lines[i])) + 1


def too_deep(path: str, text: str) -> SourceError:
    """The error for code nested deeper than the tools' recursion (CPython accepts about three
    times as much), at the line where it is deepest."""
    import ast  # only on this rare path

    deepest, line = 0, 1
    stack: list[tuple[ast.AST, int]] = [(python_ast(text, path), 0)]
    while stack:  # iterative: the recursion is what ran out
        node, depth = stack.pop()
        if depth > deepest and hasattr(node, "lineno"):
            deepest, line = depth, node.lineno
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return SourceError(path, line, "nested too deeply to analyse (split this expression)")


@dataclass(frozen=True)
class Source:
    """The decoded text of a file plus what is needed to write it back unchanged."""

    path: str
    text: str
    encoding: str = "utf-8"
    # Whether encoding ``text`` gives back the bytes read: not with unicode_escape, whose encoder
    # writes every newline as ``\\n``.
    lossless: bool = True

    def encode(self, text: str) -> bytes:
        """``text`` in the source's encoding; an error rather than bytes that would change the
        parts of the file no one edited."""
        if not self.lossless:
            raise SourceError(
                self.path,
                0,
                f"not written: the {self.encoding} codec would not give back the bytes it read "
                "(save the file as UTF-8)",
            )
        try:
            return text.encode(self.encoding)
        except UnicodeEncodeError as err:
            line = text.count("\n", 0, err.start) + 1
            raise SourceError(
                self.path, line, f"not written: {text[err.start]!r} has no {self.encoding} form"
            ) from None
        except UnicodeError as err:  # idna's encoder refuses long lines
            raise SourceError(self.path, 0, f"not written: {self.encoding}: {err}") from None


# PEP 263: where Python looks for the coding comment, on line 1 or 2.
_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.ASCII)
_NOT_ASCII = re.compile(rb"[\x80-\xff]")
_UTF8 = ("utf-8", "utf-8-sig")


def decode(path: str, data: bytes) -> Source:
    """Decode ``data`` the way Python would import it; raise a one-line error otherwise.

    An encoding problem is reported at the coding comment's line, as Python refuses such a file
    (``SyntaxError: encoding problem: rot13``) and the comment is what to fix."""
    if b"\0" in data:
        raise SourceError(path, 1, "binary file (contains NUL bytes), not Python source")
    try:
        encoding = _detect_encoding(data)
    except SyntaxError as err:
        raise SourceError(path, _cookie_line(data), _detect_problem(str(err.msg))) from None
    if encoding not in _UTF8 and (problem := _codec_problem(encoding)) is not None:
        raise SourceError(path, _cookie_line(data), f"encoding problem: {encoding} {problem}")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as err:
        start = err.start + (len(codecs.BOM_UTF8) if encoding == "utf-8-sig" else 0)
        line = data.count(b"\n", 0, start) + 1
        byte = data[start : start + 1].hex()
        raise SourceError(path, line, f"not valid {encoding} (byte 0x{byte})") from None
    if encoding in _UTF8:
        return Source(path, text, encoding)
    return Source(path, text, encoding, lossless=_encoded(text, encoding) == data)


def _detect_encoding(data: bytes) -> str:
    """``tokenize.detect_encoding``'s answer, also where Python reads a coding comment that
    tokenize refuses: one on a line holding bytes that are not UTF-8 (``# coding: latin-1``
    then an author's name in Latin-1). Without a comment that is UTF-8, whose decoding then
    names the byte that is not."""
    try:
        return tokenize.detect_encoding(io.BytesIO(data).readline)[0]
    except SyntaxError as err:
        if not str(err.msg).startswith("invalid or missing encoding declaration"):
            raise
    bom = codecs.BOM_UTF8 if data.startswith(codecs.BOM_UTF8) else b""
    head = b"\n".join(data[len(bom) :].split(b"\n", 2)[:2])
    return tokenize.detect_encoding(io.BytesIO(bom + _NOT_ASCII.sub(b"?", head)).readline)[0]


def _codec_problem(encoding: str) -> str | None:
    """Why Python cannot read source in ``encoding`` (found by ``codecs.lookup``), if it cannot:
    a codec that is not between bytes and text (rot13, hex, zlib), or one that does not read the
    ASCII of the coding comment as ASCII (UTF-16, EBCDIC, punycode, 'undefined')."""
    comment = b"# -*- coding: " + encoding.encode("ascii", "replace") + b" -*-\n"
    try:
        same = comment.decode(encoding) == comment.decode("ascii")
    except LookupError:
        return "is not a text encoding (fix the coding comment)"
    except UnicodeError:
        same = False
    if same:
        return None
    return "cannot be a source encoding: it does not keep ASCII as it is (PEP 263)"


def _encoded(text: str, encoding: str) -> bytes | None:
    """``text`` in ``encoding``, or None where the codec refuses it."""
    try:
        return text.encode(encoding)
    except UnicodeError:  # also idna's encoder, on a line over 63 characters
        return None


def _detect_problem(message: str) -> str:
    """tokenize's reason, in the words of Python's own refusal and with what to do."""
    if message.startswith("unknown encoding"):
        name = message.rpartition(": ")[2]
        return f"encoding problem: unknown encoding {name!r} (fix the coding comment)"
    if message.startswith("encoding problem"):  # tokenize: a coding comment beside a UTF-8 BOM
        return (
            "encoding problem: the file starts with a UTF-8 byte order mark but its coding "
            "comment names another encoding"
        )
    return message


def _cookie_line(data: bytes) -> int:
    """The line of the coding comment (1 or 2), or else the first of them that is not UTF-8."""
    lines = data.split(b"\n", 2)[:2]
    for number, line in enumerate(lines, start=1):
        if _COOKIE.match(line):
            return number
    for number, line in enumerate(lines, start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            return number
    return 1


def read(path: str) -> Source:
    """Read ``path`` (or standard input for ``-``)."""
    if path == STDIN:
        return decode(STDIN_NAME, sys.stdin.buffer.read())
    try:
        kind = _special_kind(os.stat(path).st_mode)
        if kind is not None:  # opening a FIFO waits for a writer; a device never ends
            raise SourceError(path, 0, f"is a {kind}, not a file: not opened")
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise SourceError(path, 0, "no such file") from None
    except IsADirectoryError:
        raise SourceError(path, 0, "is a directory") from None
    except OSError as err:
        raise SourceError(path, 0, err.strerror or str(err)) from None
    return decode(path, data)


def write_atomic(path: str, data: bytes) -> None:
    """Replace the file ``path`` names with ``data`` in one rename, keeping its mode bits.

    A symbolic link is followed: the file it points to is rewritten, in that file's folder, and
    the link stays a link. A file with other hard links is refused: a rename would leave the
    other names with the old text. The bytes go to a temporary file in the same folder first, so
    a crash or a full disk never leaves a half-written file behind; that file, and nothing
    else, is removed when the write fails (a file named like it may be the user's). A new file
    gets the mode ``open()`` would give it, not the temporary file's private 0600. A read-only
    file is refused: its owner said it is not to be rewritten (root could).
    """
    target = Path(os.path.realpath(path))
    try:
        info: os.stat_result | None = target.stat()
    except OSError:  # not there (or not reachable): a new file, and its write says why not
        info = None
    mode = stat.S_IMODE(info.st_mode) if info else _new_file_mode()
    if info and not mode & stat.S_IWUSR:
        raise SourceError(path, 0, "read-only file, not rewritten (make it writable to allow)")
    if info and info.st_nlink > 1:
        raise SourceError(
            path,
            0,
            f"has {info.st_nlink} hard links, not rewritten: a rewrite would leave the other "
            "names with the old text (write the result elsewhere, or unlink the others)",
        )
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException as err:  # also SIGINT, and SIGTERM through exit_on_signals
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise SourceError(path, 0, f"cannot write: {err.strerror or err}") from None
        raise


def _new_file_mode() -> int:
    umask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(umask)
    return 0o666 & ~umask


def _special_kind(mode: int) -> str | None:
    """What a path that is neither a regular file nor a folder is, to say so."""
    for test, kind in (
        (stat.S_ISFIFO, "named pipe (FIFO)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return kind
    return None


def iter_paths(
    paths: Iterable[str], suffixes: tuple[str, ...] = (".py",)
) -> Iterator[str | SourceError]:
    """Yield the files named in ``paths``, walking folders, and the error of each folder the
    walk could not list (in its place in the order), so that a run reports it and goes on.

    Files named directly are always yielded (so a missing one is reported, not skipped); inside
    folders, hidden entries, well-known build/venv folders and git-ignored files are skipped.
    """
    for path in paths:
        if path == STDIN or not Path(path).is_dir():
            yield path
            continue
        files, unlisted = _walk(Path(path), suffixes)
        for found in _drop_git_ignored(Path(path), sorted([*files, *unlisted])):
            yield unlisted.get(found) or str(found)


def _walk(root: Path, suffixes: tuple[str, ...]) -> tuple[list[Path], dict[Path, SourceError]]:
    """The files under ``root``, and the folders that could not be listed with their errors:
    ``os.walk`` drops those silently, and their files with them."""
    files: list[Path] = []
    unlisted: dict[Path, SourceError] = {}

    def unlistable(err: OSError) -> None:
        folder = Path(err.filename or root)
        why = err.strerror or str(err)
        message = f"cannot list this folder ({why}): its files were skipped"
        unlisted[folder] = SourceError(str(folder), 0, message)

    for folder, dirs, names in os.walk(root, onerror=unlistable):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in _SKIPPED_DIRS]
        files.extend(
            Path(folder) / name
            for name in names
            if name.endswith(suffixes) and not name.startswith(".")
        )
    return files, unlisted


def _drop_git_ignored(root: Path, files: list[Path]) -> list[Path]:
    """Ask git which of ``files`` (or folders) it ignores; outside a checkout (or without git)
    keep them all."""
    if not files:
        return files
    try:
        result = subprocess.run(
            ["git", "check-ignore", "--stdin", "-z"],
            cwd=root,
            input="\0".join(os.path.realpath(f) for f in files),
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return files
    if result.returncode not in (0, 1):  # 128: not a git checkout
        return files
    ignored = {Path(p) for p in result.stdout.split("\0") if p}
    # realpath, not Path.resolve(): a symlink loop is reported when the file is read, not here.
    return [f for f in files if Path(os.path.realpath(f)) not in ignored]
