"""Files fetched and written whole: a URL's body downloaded with a progress bar, a file that
appears only once complete, and temporary names that no other process shares."""

from __future__ import annotations

import contextlib
import http.client
import os
import secrets
import urllib.request
from pathlib import Path

from .errors import UserError, first_line
from .progress import progress


def unique() -> str:
    """A name for a temporary file that no other process shares, on another machine either (the
    first process of each machine of a torchrun prepares the data, maybe on one shared disk)."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def download(url: str, path: Path, what: str) -> None:
    """url's body streamed into path, whole or not at all, with a progress bar over its
    Content-Length; what names it in errors."""
    print(f"downloading {url} -> {path}")
    try:
        response = urllib.request.urlopen(url, timeout=30)
    except (OSError, ValueError, http.client.HTTPException) as e:   # ValueError: not a URL
        raise _unreachable(url, path, what, e) from None

    def copy(out) -> None:
        size = response.headers.get("Content-Length")
        with progress(int(size) if size and size.isdigit() else None, f"downloading {path.name}", "B",
                      unit_scale=True) as bar:
            while True:
                try:
                    chunk = response.read(1 << 16)
                except (OSError, http.client.HTTPException) as e:     # a reply cut short is the latter
                    raise _unreachable(url, path, what, e) from None
                if not chunk:
                    return
                out.write(chunk)
                bar.update(len(chunk))
    with response:
        write_whole(path, copy, f"downloaded {what.removeprefix('the ')}")


def _unreachable(url: str, path: Path, what: str, error: BaseException) -> UserError:
    return UserError(f"could not download {what} ({error.__class__.__name__}: {first_line(error)}); "
                     f"put the file from {url} at {path.absolute()} and run again, or give "
                     "--data_url=URL of a copy")


def write_whole(path: Path, write, what: str) -> None:
    """write(file) into a file beside path that becomes path only once written whole."""
    tmp = path.with_name(f"{path.name}.part{unique()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as out:
            write(out)
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"cannot write the {what} to {path} ({e.strerror or e})") from None
    finally:
        with contextlib.suppress(OSError):     # its folder may be a file
            tmp.unlink(missing_ok=True)
