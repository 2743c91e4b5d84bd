"""Reading a user's file (config, trace, key file) with limits: a regular file only (never a
FIFO, a device or /dev/zero), at most a given size, UTF-8 — or a refusal saying which."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class TextFileError(ValueError):
    """A file that cannot be used as text; `cause` and `fix` are for a refusal."""

    def __init__(self, path: str, cause: str, fix: str) -> None:
        self.path = path
        self.cause = cause
        self.fix = fix
        super().__init__(f"{path}: {cause} — fix: {fix}")


def human_size(n: int) -> str:
    if n >= 1024 * 1024 and n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)} MiB"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024} KiB"
    return f"{n} bytes"


def _position(data: bytes, offset: int) -> str:
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return f"line {line}, column {column} (byte {offset})"


def decode_utf8(data: bytes, where: str, what: str = "the file") -> str:
    """`data` as text; TextFileError naming the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TextFileError(
            where,
            f"{what} is not UTF-8 text: byte 0x{data[exc.start]:02x} at "
            f"{_position(data, exc.start)}",
            "save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
        ) from None


def read_text(path: str | Path, *, limit: int, what: str = "the file") -> str:
    """The file's text, read without following it into a FIFO, a device or past `limit` bytes."""
    p = str(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the stat below refuses it.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise TextFileError(
            p, f"cannot be read ({exc.strerror or exc})", "check the path and permissions"
        ) from None
    except ValueError:  # a NUL byte in the path (possible from Python, not from a shell)
        raise TextFileError(
            repr(p)[:80], "is not a path (it holds a NUL byte)", "give the file's path"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = (
                "a directory"
                if stat.S_ISDIR(info.st_mode)
                else "a FIFO"
                if stat.S_ISFIFO(info.st_mode)
                else "a device"
                if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                else "a socket or special file"
            )
            raise TextFileError(
                p,
                f"is {kind}, not a regular file",
                "give the path of a regular file (write a pipe's output to a file first)",
            )
        if info.st_size > limit:
            raise TextFileError(
                p,
                f"is {info.st_size} bytes, above the limit of {human_size(limit)} for {what}",
                f"{what} must be at most {human_size(limit)}; remove what is not needed",
            )
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # the file may grow while read: never more than limit + 1
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise TextFileError(
                p,
                f"grew above the limit of {human_size(limit)} for {what} while being read",
                f"{what} must be at most {human_size(limit)}",
            )
    except OSError as exc:
        raise TextFileError(
            p, f"cannot be read ({exc.strerror or exc})", "check the path and permissions"
        ) from None
    finally:
        os.close(fd)
    return decode_utf8(b"".join(chunks), p, what)
