# fast.py: stat / list / tree for the exec-only backend where the sandbox has python3 (>= 3.6).
#
# Run by a short bootstrap that reads standard input: the first line is this script in base64,
# then ITEMS, one per line: the workspace root (canonical, base64), the time precision ("ns" or
# "s", the probe's), the operation, its arguments (base64) and "END" (a cut input is refused).
# Output: one line __RESULT__, then "ok" and the answer, or "err TOKEN TEXT" (lib.sh's framing).
#
# Paths are walked component by component from a descriptor of the root (openat with
# O_NOFOLLOW), so a path past PATH_MAX works and never leaves the workspace: a symlink met on
# the way is read and followed by hand, and refused when it leads out. Attribute lines are
# `stat -c "$SF"`'s, so a version made here equals the one the sh scripts make for the file.
import base64
import errno
import os
import stat
import sys

# Where the answer goes: standard output, or the session server's buffer when the server runs
# this script itself (src/remote/exec/session.rs), many times in one process: so every
# descriptor opened is also closed on every path (FDS, closed by main whatever happens).
try:
    OUT
except NameError:
    OUT = sys.stdout.buffer
FDS = set()


def put(text):
    OUT.write(text.encode("utf-8", "surrogateescape"))


def fd_open(*a, **k):
    fd = os.open(*a, **k)
    FDS.add(fd)
    return fd


def fd_dup(fd):
    fd = os.dup(fd)
    FDS.add(fd)
    return fd


def fd_close(fd):
    FDS.discard(fd)
    os.close(fd)


O_PATH = getattr(os, "O_PATH", os.O_RDONLY)
DIR = os.O_DIRECTORY | os.O_CLOEXEC
MAX_LINKS = 40


class Fail(Exception):
    def __init__(self, token, text):
        Exception.__init__(self, token)
        self.token = token
        self.text = text


def sys_fail(e):
    return Fail("SYS", "%s: %s" % (OP, os.strerror(e.errno or errno.EIO)))


def b64(b):
    return base64.b64encode(b).decode("ascii")


def when(ns):
    if PREC != "ns":
        return "%d" % (ns // 1000000000)
    sign = "-" if ns < 0 else ""
    a = abs(ns)
    return "%s%d.%09d" % (sign, a // 1000000000, a % 1000000000)


def line(st):
    return "%x %d %d %d %s %s %s %d %d %d %x %x" % (
        st.st_mode,
        st.st_size,
        st.st_uid,
        st.st_gid,
        when(st.st_atime_ns),
        when(st.st_mtime_ns),
        when(st.st_ctime_ns),
        st.st_dev,
        st.st_ino,
        st.st_nlink,
        os.major(st.st_rdev),
        os.minor(st.st_rdev),
    )


def xattrs(name):
    # Relative to the current directory (fchdir'd to the entry's own): listxattr takes no
    # dir_fd. None when the file system or the sandbox does not say.
    try:
        return "1" if os.listxattr(name, follow_symlinks=False) else "0"
    except (OSError, AttributeError):
        return None


def entry(out, dfd, name, st):
    """The S [L] [X] lines of `name` in the directory `dfd` (the current directory)."""
    out.append("S " + line(st))
    if stat.S_ISLNK(st.st_mode):
        out.append("L " + b64(os.readlink(name, dir_fd=dfd)))
    x = xattrs(name)
    if x is not None:
        out.append("X " + x)


def resolve(rel, follow_last):
    """Walk `rel` from the root. Answers (dirs, name): the descriptors of the directories
    walked (the last one holds `name`), and the final component (None: the last descriptor is
    the target itself, a directory)."""
    dirs = [fd_open(ROOT, O_PATH | DIR)]
    todo = [c for c in rel.split(b"/") if c]
    links = 0
    while todo:
        c = todo.pop(0)
        if c == b".":
            continue
        if c == b"..":
            if len(dirs) == 1:
                raise Fail("EACCES", "leads out of the workspace")
            fd_close(dirs.pop())
            continue
        if not todo and not follow_last:
            return dirs, c
        st = os.stat(c, dir_fd=dirs[-1], follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
            t = os.readlink(c, dir_fd=dirs[-1])
            if t.startswith(b"/"):
                if t != ROOT and not t.startswith(ROOT + b"/"):
                    raise Fail("EACCES", "leads out of the workspace")
                for d in dirs[1:]:
                    fd_close(d)
                del dirs[1:]
                t = t[len(ROOT):]
            todo = [x for x in t.split(b"/") if x] + todo
            continue
        if not stat.S_ISDIR(st.st_mode):
            if todo:
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
            return dirs, c
        dirs.append(fd_open(c, O_PATH | DIR | os.O_NOFOLLOW, dir_fd=dirs[-1]))
    return dirs, None


def close(dirs):
    for d in dirs:
        fd_close(d)


def stat_one(out, rel):
    try:
        dirs, name = resolve(rel, False)
    except Fail as f:
        out.append("E %s %s" % (f.token, f.text))
        return
    except OSError as e:
        out.append("E SYS stat: " + os.strerror(e.errno or errno.EIO))
        return
    try:
        if name is None:
            os.fchdir(dirs[-1])
            st = os.fstat(dirs[-1])
            name = b"."
        else:
            os.fchdir(dirs[-1])
            st = os.stat(name, dir_fd=dirs[-1], follow_symlinks=False)
        entry(out, dirs[-1], name, st)
    except OSError as e:
        out.append("E SYS stat: " + os.strerror(e.errno or errno.EIO))
    finally:
        close(dirs)


def open_listed(rel):
    """A readable descriptor of the directory `rel` (a final symlink followed, inside only)."""
    try:
        dirs, name = resolve(rel, True)
    except OSError as e:
        if e.errno == errno.ENOTDIR:
            raise Fail("ENOTDIR", "not a directory")
        raise
    try:
        if name is not None:
            raise Fail("ENOTDIR", "not a directory")
        try:
            return fd_open(".", os.O_RDONLY | DIR, dir_fd=dirs[-1])
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise Fail("EACCES", "permission denied")
            raise
    finally:
        close(dirs)


def entries(out, fd, prefix):
    """One N/S/[L]/[X] group per entry of the directory `fd`; answers its subdirectories."""
    os.fchdir(fd)
    subs = []
    for n in os.listdir(fd):
        n = os.fsencode(n)
        try:
            st = os.stat(n, dir_fd=fd, follow_symlinks=False)
            group = ["N " + b64(prefix + n)]
            entry(group, fd, n, st)
        except OSError as e:
            if e.errno == errno.ENOENT:
                continue  # gone since listed: as if listed a moment later
            raise
        out.extend(group)
        if stat.S_ISDIR(st.st_mode):
            subs.append(n)
    return subs


def list_dir(out, rel):
    fd = open_listed(rel)
    try:
        entries(out, fd, b"")
    finally:
        fd_close(fd)


def tree(out, rel):
    top = open_listed(rel)
    # Depth first with one descriptor per level; what cannot be entered is left out (find's way).
    stack = [(top, b"", entries(out, top, b""))]
    while stack:
        fd, prefix, subs = stack[-1]
        if not subs:
            fd_close(fd)
            stack.pop()
            continue
        n = subs.pop()
        try:
            child = fd_open(n, os.O_RDONLY | DIR | os.O_NOFOLLOW, dir_fd=fd)
        except OSError:
            continue
        p = prefix + n + b"/"
        stack.append((child, p, entries(out, child, p)))


def open_below(top, rel):
    """The directory `rel` (components below the descriptor `top`), opened one component at a
    time without following a symlink; None when it cannot be entered."""
    fd = fd_dup(top)
    try:
        for c in rel.split(b"/"):
            if c:
                nfd = fd_open(c, os.O_RDONLY | DIR | os.O_NOFOLLOW, dir_fd=fd)
                fd_close(fd)
                fd = nfd
        return fd
    except OSError:
        fd_close(fd)
        return None


def listings(out, rel, budget):
    # Breadth first as src/remote/listings.rs walks: `D path` then the listing's groups; the
    # first listing is whole, each next one only while the entries after the first fit
    # `budget`. What cannot be entered is left out (the asker answers it as not descended).
    top = open_listed(rel)
    try:
        queue = [b""]
        first = True
        while queue:
            d = queue.pop(0)
            fd = fd_dup(top) if first else open_below(top, d)
            if fd is None:
                continue
            group = []
            try:
                # Counted before each entry is stat'ed: a huge directory past the budget
                # costs one listing, not a stat of every name in it.
                if not first and len(os.listdir(fd)) > budget:
                    break
                subs = entries(group, fd, b"")
            except OSError:
                if first:
                    raise
                continue
            finally:
                fd_close(fd)
            n = sum(1 for g in group if g.startswith("N "))
            if not first:
                if n > budget:
                    break
                budget -= n
            first = False
            out.append("D " + b64(d))
            out.extend(group)
            queue.extend((d + b"/" + c) if d else c for c in sorted(subs))
    finally:
        fd_close(top)


def read(rel, offset, length):
    """read.sh's answer: the stat line before, the bytes as they are, then `E 0` and the stat
    line of the name after (the caller reads again when the two differ)."""
    try:
        dirs, name = resolve(rel, True)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise Fail("ENOENT", "read: not found")
        raise
    try:
        if name is None:
            raise Fail("EISDIR", "read: a directory")
        try:
            st = os.stat(name, dir_fd=dirs[-1], follow_symlinks=False)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise Fail("ENOENT", "read: not found")
            raise
        if stat.S_ISDIR(st.st_mode):
            raise Fail("EISDIR", "read: a directory")
        if not stat.S_ISREG(st.st_mode):
            raise Fail("EINVAL", "read: not a regular file")
        fd = fd_open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirs[-1])
        try:
            before = line(os.fstat(fd))
            parts = []
            got = 0
            while got < length:
                b = os.pread(fd, length - got, offset + got)
                if not b:
                    break
                parts.append(b)
                got += len(b)
        finally:
            fd_close(fd)
        try:
            after = line(os.stat(name, dir_fd=dirs[-1], follow_symlinks=False))
        except OSError:
            after = "gone"
    finally:
        close(dirs)
    put("\n__RESULT__\nok\nS %s\n" % before)
    for b in parts:
        OUT.write(b)
    put("\nE 0 %s\n" % after)


def main():
    global ROOT, PREC, OP
    items = list(ITEMS)
    if items and items[-1] == b"":
        items.pop()  # after the last newline (an empty argument is an empty line, kept)
    if len(items) < 3 or items[-1] != b"END":
        put("\n__RESULT__\nerr EIO a cut program\n")
        return
    ROOT = base64.b64decode(items[0])
    PREC = items[1].decode("ascii")
    OP = items[2].decode("ascii")
    args = [base64.b64decode(a) for a in items[3:-1]]
    out = []
    try:
        if OP == "stat":
            for rel in args:
                stat_one(out, rel)
        elif OP == "list":
            list_dir(out, args[0])
        elif OP == "tree":
            tree(out, args[0])
        elif OP == "listings":
            listings(out, args[0], int(args[1]))
        elif OP == "read":
            read(args[0], int(args[1]), int(args[2]))
            return
        else:
            raise Fail("EINVAL", "unknown operation")
    except Fail as f:
        put("\n__RESULT__\nerr %s %s\n" % (f.token, f.text))
        return
    except OSError as e:
        put("\n__RESULT__\nerr SYS %s\n" % sys_fail(e).text)
        return
    out.insert(0, "\n__RESULT__\nok")
    out.append("")
    put("\n".join(out))


ROOT = PREC = OP = None
try:
    main()
finally:
    for fd in list(FDS):
        fd_close(fd)
