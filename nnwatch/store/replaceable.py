"""Who could have put a directory entry where it is, or could replace it: the test that
:func:`nnwatch.store.paths.open_dir_nofollow` applies to each component of a path it walks."""

from __future__ import annotations

import os
import stat


def replaceable(st: os.stat_result, parent: os.stat_result, me: int) -> str | None:
    """Why another user could have made or could replace the entry ``st`` of directory
    ``parent`` (in words that follow its path), or None when only this user or root could."""
    if st.st_uid not in (0, me):
        return f"belongs to uid {st.st_uid}"
    if parent.st_uid not in (0, me):
        return f"is in a directory of uid {parent.st_uid}, who can replace it"
    mode = stat.S_IMODE(parent.st_mode)
    if mode & stat.S_ISVTX:
        return None  # sticky: only the entry's owner (or the directory's) may rename it
    if mode & 0o002:
        return "is in a directory every user can write (no sticky bit)"
    if mode & 0o020 and not _private_group(parent.st_gid, me):
        return f"is in a directory that group {parent.st_gid} can write"
    return None


def _private_group(gid: int, me: int) -> bool:
    """A group whose only member is this user (a user private group under umask 002)."""
    try:
        import grp
        import pwd

        name = pwd.getpwuid(me).pw_name
        if any(member != name for member in grp.getgrgid(gid).gr_mem):
            return False
        return not any(p.pw_gid == gid and p.pw_uid != me for p in pwd.getpwall())
    except (ImportError, KeyError):
        return False
