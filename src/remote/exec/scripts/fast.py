# fast.py: stat / list / tree / read, and every change (namespace operations, commits), for the
# exec-only backend where the sandbox has python3 (>= 3.6).
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


def open_root():
    """The workspace root, walked from / one component at a time without following a symlink:
    its path is canonical (the probe's), so a symlink met on it was swapped in since, by code
    that can write one of its parents, and is refused rather than followed out."""
    fd = fd_open(b"/", O_PATH | DIR)
    try:
        for c in ROOT.split(b"/"):
            if c:
                nfd = fd_open(c, O_PATH | DIR | os.O_NOFOLLOW, dir_fd=fd)
                fd_close(fd)
                fd = nfd
    except OSError as e:
        fd_close(fd)
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Fail("EACCES", "the workspace root is no longer a directory on its path (a symlink swapped in)")
        raise
    return fd


def resolve(rel, follow_last, missing_ok=False):
    """Walk `rel` from the root. Answers (dirs, name): the descriptors of the directories
    walked (the last one holds `name`), and the final component (None: the last descriptor is
    the target itself, a directory). `missing_ok`: a final name (or where a final symlink
    leads) that does not exist is answered too, to be created."""
    dirs = [open_root()]
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
        try:
            st = os.stat(c, dir_fd=dirs[-1], follow_symlinks=False)
        except OSError as e:
            if e.errno == errno.ENOENT and missing_ok and not todo:
                return dirs, c
            raise
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


# --- Changes. Namespace operations and commits, each relative to held directory descriptors:
# namespace.sh and commit.sh check a path with realpath and then use it, a window in which
# sandbox code that can write the workspace swaps a directory for a symlink and turns the
# operation on a file outside. A final symlink is followed only where the sh scripts follow
# it (commit, fallocate), and then by hand, inside only.


def octal(a):
    return int(a, 8) if a else None


def version(st):
    """The version fields commit.sh compares (`stat -c "$VF"`)."""
    return "%d %d %d %s" % (st.st_dev, st.st_ino, st.st_size, when(st.st_mtime_ns))


def lstat_at(dfd, name):
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return None
        raise


def attrs(out, dfd, name):
    """namespace.sh's `attrs`: the S line, and L with the target of a symlink."""
    st = os.fstat(dfd) if name is None else os.stat(name, dir_fd=dfd, follow_symlinks=False)
    out.append("S " + line(st))
    if stat.S_ISLNK(st.st_mode):
        out.append("L " + b64(os.readlink(name, dir_fd=dfd)))


def ns_time(t):
    """`touch -d @` seconds with nanoseconds, as nanoseconds."""
    neg = t.startswith(b"-")
    s, _, f = t.lstrip(b"-").partition(b".")
    ns = int(s) * 1000000000 + int((f + b"000000000")[:9])
    return -ns if neg else ns


def chmod_at(dfd, name, mode):
    """chmod of `name` itself, never of where a symlink swapped in leads."""
    fd = fd_open(name, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise Fail("EOPNOTSUPP", "the mode of a symlink")
        try:
            os.chmod("/proc/self/fd/%d" % fd, mode)
            return
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
        # No /proc: through a descriptor that can change it (not a socket's).
        rfd = fd_open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        try:
            os.fchmod(rfd, mode)
        finally:
            fd_close(rfd)
    finally:
        fd_close(fd)


def libc():
    import ctypes

    lib = ctypes.CDLL(None, use_errno=True)
    return ctypes, lib


def renameat2(sfd, sname, dfd, dname, flag):
    ctypes, lib = libc()
    if not hasattr(lib, "renameat2"):
        raise Fail("EOPNOTSUPP", "rename: no renameat2 in the sandbox's C library")
    if lib.renameat2(sfd, sname, dfd, dname, ctypes.c_uint(flag)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def ns(out, a):
    op, rel = a[0].decode("ascii"), a[1]
    dirs, name = resolve(rel, False, True)
    try:
        ns_at(out, op, rel, dirs, name, a[2:])
    finally:
        close(dirs)


def ns_at(out, op, rel, dirs, name, a):
    dfd = dirs[-1]
    shown = rel.decode("utf-8", "surrogateescape")
    if name is None and op not in ("setattr", "readlink", "fallocate"):
        raise Fail("EINVAL", "%s of the workspace root" % op)
    if op == "create":
        fd = fd_open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            os.fchmod(fd, octal(a[0]))
        finally:
            fd_close(fd)
    elif op == "mkdir":
        m = octal(a[0])
        os.mkdir(name, 0o700, dir_fd=dfd)
        # The mode asked for is the mode made, plus the set-group-ID bit a set-group-ID parent
        # passes on (as the kernel gives it).
        if os.fstat(dfd).st_mode & stat.S_ISGID:
            m |= stat.S_ISGID
        chmod_at(dfd, name, m)
    elif op == "mkfifo":
        # Made private, then given the mode asked for (the umask is the process's: the
        # session's server runs other programs beside).
        os.mkfifo(name, 0o600, dir_fd=dfd)
        chmod_at(dfd, name, octal(a[0]))
    elif op == "socket":
        import socket

        s = socket.socket(socket.AF_UNIX)
        try:
            # bind() takes a path: the held directory's, through /proc (short, and the
            # directory it names cannot be swapped).
            s.bind(b"/proc/self/fd/%d/%s" % (dfd, name))
        finally:
            s.close()
        chmod_at(dfd, name, octal(a[0]))
    elif op == "mknod":
        kind = stat.S_IFCHR if a[1] == b"c" else stat.S_IFBLK
        dev = os.makedev(int(a[2]), int(a[3]))
        os.mknod(name, 0o600 | kind, dev, dir_fd=dfd)
        chmod_at(dfd, name, octal(a[0]))
    elif op == "unlink":
        st = lstat_at(dfd, name)
        if st is None:
            raise Fail("ENOENT", shown)
        if stat.S_ISDIR(st.st_mode):
            raise Fail("EISDIR", shown)
        os.unlink(name, dir_fd=dfd)
        return
    elif op == "rmdir":
        st = lstat_at(dfd, name)
        if st is None:
            raise Fail("ENOENT", shown)
        if stat.S_ISLNK(st.st_mode):
            raise Fail("ENOTDIR", shown)
        os.rmdir(name, dir_fd=dfd)
        return
    elif op == "rename":
        to_dirs, to_name = resolve(a[0], False, True)
        try:
            if to_name is None:
                raise Fail("EINVAL", "rename of the workspace root")
            rename_at(dfd, name, to_dirs[-1], to_name, a[1], shown)
        finally:
            close(to_dirs)
        return
    elif op == "link":
        new_dirs, new_name = resolve(a[0], False, True)
        try:
            if new_name is None:
                raise Fail("EEXIST", a[0].decode("utf-8", "surrogateescape"))
            st = lstat_at(dfd, name)
            if st is None:
                raise Fail("ENOENT", shown)
            if stat.S_ISDIR(st.st_mode):
                raise Fail("EPERM", shown + ": a directory")
            os.link(name, new_name, src_dir_fd=dfd, dst_dir_fd=new_dirs[-1], follow_symlinks=False)
            attrs(out, new_dirs[-1], new_name)
        finally:
            close(new_dirs)
        return
    elif op == "symlink":
        os.symlink(a[0], name, dir_fd=dfd)
    elif op == "readlink":
        st = None if name is None else lstat_at(dfd, name)
        if name is not None and st is None:
            raise Fail("ENOENT", shown)
        if st is None or not stat.S_ISLNK(st.st_mode):
            raise Fail("EINVAL", shown + ": not a symlink")
        out.append("L " + b64(os.readlink(name, dir_fd=dfd)))
        return
    elif op == "setattr":
        setattr_at(dfd, name, a, shown)
    elif op == "fallocate":
        # The sh script follows a final symlink (inside only), as a write would.
        fdirs, fname = resolve(rel, True, False)
        try:
            fallocate_at(fdirs[-1], fname, a, shown)
            attrs(out, fdirs[-1], fname)
        finally:
            close(fdirs)
        return
    else:
        raise Fail("EINVAL", "unknown operation " + op)
    attrs(out, dfd, name)


def rename_at(fdfd, fname, tdfd, tname, how, shown):
    fst = lstat_at(fdfd, fname)
    if fst is None:
        raise Fail("ENOENT", shown)
    tst = lstat_at(tdfd, tname)
    # Two names of one file: nothing to do (rename(2)'s rule); the same name likewise.
    if tst is not None and (fst.st_dev, fst.st_ino) == (tst.st_dev, tst.st_ino):
        return
    if how == b"exchange":
        renameat2(fdfd, fname, tdfd, tname, 2)
    elif how == b"noreplace":
        renameat2(fdfd, fname, tdfd, tname, 1)
    else:
        os.rename(fname, tname, src_dir_fd=fdfd, dst_dir_fd=tdfd)


def setattr_at(dfd, name, a, shown):
    mode, size, atime, mtime, uid, gid = a[:6]
    st = os.fstat(dfd) if name is None else lstat_at(dfd, name)
    if st is None:
        raise Fail("ENOENT", shown)
    here = b"." if name is None else name
    if mode and stat.S_ISLNK(st.st_mode):
        raise Fail("EOPNOTSUPP", shown + ": the mode of a symlink")
    if uid or gid:
        os.chown(here, int(uid) if uid else -1, int(gid) if gid else -1, dir_fd=dfd, follow_symlinks=False)
    if mode:
        if name is None:
            rfd = fd_open(".", os.O_RDONLY | DIR, dir_fd=dfd)
            try:
                os.fchmod(rfd, octal(mode))
            finally:
                fd_close(rfd)
        else:
            chmod_at(dfd, name, octal(mode))
    if size:
        if stat.S_ISLNK(st.st_mode):
            raise Fail("EINVAL", shown + ": a symlink")
        if stat.S_ISDIR(st.st_mode):
            raise Fail("EISDIR", shown)
        fd = fd_open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        try:
            os.ftruncate(fd, int(size))
        finally:
            fd_close(fd)
    if atime or mtime:
        now = os.stat(here, dir_fd=dfd, follow_symlinks=False)
        a_ns = ns_time(atime) if atime else now.st_atime_ns
        m_ns = ns_time(mtime) if mtime else now.st_mtime_ns
        os.utime(here, ns=(a_ns, m_ns), dir_fd=dfd, follow_symlinks=False)


def fallocate_at(dfd, name, a, shown):
    if name is None:
        raise Fail("EISDIR", shown)
    st = lstat_at(dfd, name)
    if st is None:
        raise Fail("ENOENT", shown)
    if stat.S_ISDIR(st.st_mode):
        raise Fail("EISDIR", shown)
    offset, length, keep = int(a[0]), int(a[1]), a[2] == b"1"
    fd = fd_open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    try:
        ctypes, lib = libc()
        lib.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        if lib.fallocate(fd, 1 if keep else 0, offset, length) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    finally:
        fd_close(fd)


def copy_into(src, dst, start, length, at):
    """`length` bytes of `src` from `start` into `dst` at `at`; the holes of `src` kept
    (skipped) where the file system tells where its data is."""
    end = start + length
    pos = start
    while pos < end:
        try:
            data = os.lseek(src, pos, os.SEEK_DATA)
            hole = os.lseek(src, data, os.SEEK_HOLE)
        except OSError as e:
            if e.errno == errno.ENXIO:
                return  # only a hole is left
            data, hole = pos, end  # no SEEK_DATA here: every byte copied
        data, hole = max(data, pos), min(hole, end)
        while data < hole:
            b = os.pread(src, min(hole - data, 1 << 20), data)
            if not b:
                return
            write_at(dst, b, at + (data - start))
            data += len(b)
        pos = hole


def commit(out, a):
    """commit.sh's: REL BASE CMODE TMPNAME MTIME then how the content is made:
    `data BYTES`, `up NAME` (a file the transport uploaded into the workspace root),
    `patch CUT NEWLEN [OFFSET BYTES]...` (from the file's own bytes) or
    `copy SRC SRCOFFSET LEN DSTOFFSET` (copy_range: the file's bytes, SRC's range over them)."""
    rel, base, cmode, tmp, mtime, how = a[:6]
    rest = a[6:]
    shown = rel.decode("utf-8", "surrogateescape")
    up = rest[0] if how == b"up" else None
    try:
        dirs, name = resolve(rel, True, True)
        try:
            if name is None:
                raise Fail("EISDIR", shown)
            commit_at(out, dirs[-1], name, shown, base, cmode, tmp, mtime, how, rest)
        finally:
            close(dirs)
    finally:
        if up is not None:
            drop_upload(up)


def open_upload(up):
    """The file the transport uploaded into the workspace root (`.sbxfs-exec-…`): still a
    regular file of one link (not swapped for a link to a file outside)."""
    dirs = [open_root()]
    try:
        fd = fd_open(up, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirs[0])
    finally:
        close(dirs)
    s = os.fstat(fd)
    if not stat.S_ISREG(s.st_mode) or s.st_nlink != 1:
        fd_close(fd)
        raise Fail("EACCES", "the uploaded content was replaced")
    return fd


def drop_upload(up):
    dirs = [open_root()]
    try:
        os.unlink(up, dir_fd=dirs[0])
    except OSError:
        pass
    finally:
        close(dirs)


def commit_at(out, dfd, name, shown, base, cmode, tmp, mtime, how, rest):
    st = lstat_at(dfd, name)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise Fail("EISDIR", shown)
    if how == b"copy" and st is None:
        raise Fail("ENOENT", shown)  # copy_range writes into an open file
    src = None
    copied = None
    if how == b"copy":
        sdirs, sname = resolve(rest[0], True, True)
        try:
            sst = None if sname is None else lstat_at(sdirs[-1], sname)
            sshown = rest[0].decode("utf-8", "surrogateescape")
            if sname is None or (sst is not None and stat.S_ISDIR(sst.st_mode)):
                raise Fail("EISDIR", sshown)
            if sst is None:
                raise Fail("ENOENT", sshown)
            if not stat.S_ISREG(sst.st_mode):
                raise Fail("EINVAL", sshown + ": not a regular file")
            src = fd_open(sname, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=sdirs[-1])
        finally:
            close(sdirs)
    elif how == b"up":
        src = open_upload(rest[0])
    t = fd_open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    made = True
    try:
        fill(t, dfd, name, st, how, rest, src)
        if how == b"copy":
            size = os.fstat(src).st_size
            start, length = int(rest[1]), int(rest[2])
            copied = max(0, min(size - start, length))
        if mtime:
            os.utime(t, ns=(os.fstat(t).st_atime_ns, ns_time(mtime)))
        cur = lstat_at(dfd, name)
        now = "absent" if cur is None else version(cur)
        if base and now != base.decode("ascii"):
            raise Fail("CONFLICT", now)
        if cur is None:
            os.fchmod(t, octal(cmode))
            try:
                # link() refuses to replace a name (create only, even when one appears).
                os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            except OSError as e:
                if e.errno == errno.EEXIST:
                    cur = lstat_at(dfd, name)
                    raise Fail("CONFLICT", "absent" if cur is None else version(cur))
                raise
        else:
            keep_metadata(t, dfd, name, cur)
            if cur.st_nlink > 1 and stat.S_ISREG(cur.st_mode):
                # Other hard links would lose the new content to a rename: into the inode.
                p = fd_open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
                try:
                    size = os.fstat(t).st_size
                    copy_into(t, p, 0, size, 0)
                    os.ftruncate(p, size)
                    if mtime:
                        os.utime(p, ns=(os.fstat(p).st_atime_ns, ns_time(mtime)))
                finally:
                    fd_close(p)
            else:
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                made = False
    finally:
        fd_close(t)
        if src is not None:
            fd_close(src)
        if made:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
    attrs(out, dfd, name)
    if copied is not None:
        out.append("C %d" % copied)


def fill(t, dfd, name, st, how, rest, src):
    if how == b"data":
        write_at(t, rest[0], 0)
    elif how == b"up":
        size = os.fstat(src).st_size
        copy_into(src, t, 0, size, 0)
        os.ftruncate(t, size)
    elif how == b"patch":
        cut, new_len = int(rest[0]), int(rest[1])
        if cut > 0:
            if st is None:
                raise Fail("ENOENT", "a patch of a file that is not there")
            base_copy(t, dfd, name, cut)
        pairs = rest[2:]
        for i in range(0, len(pairs) - 1, 2):
            write_at(t, pairs[i + 1], int(pairs[i]))
        os.ftruncate(t, new_len)
    elif how == b"copy":
        if st is not None:
            base_copy(t, dfd, name, None)
        size = os.fstat(src).st_size
        start, length, at = int(rest[1]), int(rest[2]), int(rest[3])
        n = max(0, min(size - start, length))
        if n:
            copy_into(src, t, start, n, at)
            if os.fstat(t).st_size < at + n:
                os.ftruncate(t, at + n)
    else:
        raise Fail("EINVAL", "unknown content")


def base_copy(t, dfd, name, limit):
    """The file's own bytes (up to `limit`) into the temp `t`, holes kept."""
    b = fd_open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    try:
        if not stat.S_ISREG(os.fstat(b).st_mode):
            raise Fail("EINVAL", "not a regular file")
        size = os.fstat(b).st_size
        n = size if limit is None else min(size, limit)
        copy_into(b, t, 0, n, 0)
        os.ftruncate(t, n)
    finally:
        fd_close(b)


def write_at(fd, data, at):
    while data:
        n = os.pwrite(fd, data, at)
        data, at = data[n:], at + n


def keep_metadata(t, dfd, name, cur):
    """The new content keeps the file's extended attributes, owner (where the shell may give
    it) and mode; the owner before the mode, which a chown strips of its set-id bits."""
    if stat.S_ISREG(cur.st_mode):
        try:
            p = fd_open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            p = None
        if p is not None:
            try:
                for k in os.listxattr(p):
                    try:
                        os.setxattr(t, k, os.getxattr(p, k))
                    except OSError:
                        pass
            except (OSError, AttributeError):
                pass
            finally:
                fd_close(p)
    try:
        os.fchown(t, cur.st_uid, cur.st_gid)
    except OSError:
        pass
    os.fchmod(t, stat.S_IMODE(cur.st_mode))


def xattr(out, a):
    """xattr.sh's: OP REL [NAME [VALUE FLAG]], a final symlink not followed. The held
    directory is named through /proc (a name there cannot be swapped); the xattr calls take
    no directory descriptor."""
    op, rel = a[0], a[1]
    dirs, name = resolve(rel, False)
    try:
        dfd = dirs[-1]
        if name is not None and lstat_at(dfd, name) is None:
            raise Fail("ENOENT", "not found")
        if not os.path.isdir("/proc/self/fd"):
            raise Fail("EOPNOTSUPP", "extended attributes: no /proc in the sandbox")
        if name is None:
            p, follow = ("/proc/self/fd/%d" % dfd).encode("ascii"), True
        else:
            p, follow = ("/proc/self/fd/%d/" % dfd).encode("ascii") + name, False
        if op == b"get":
            out.append("V " + b64(os.getxattr(p, a[2], follow_symlinks=follow)))
        elif op == b"list":
            for k in os.listxattr(p, follow_symlinks=follow):
                out.append("X " + b64(os.fsencode(k)))
        elif op == b"set":
            flags = {b"create": os.XATTR_CREATE, b"replace": os.XATTR_REPLACE}.get(a[4], 0)
            os.setxattr(p, a[2], a[3], flags, follow_symlinks=follow)
        elif op == b"remove":
            os.removexattr(p, a[2], follow_symlinks=follow)
        else:
            raise Fail("EINVAL", "unknown operation")
    finally:
        close(dirs)


# --- Queries on one file, by descriptor: `edit` (scripts/edit.py's rules and answer) and `scan`
# (scripts/scan.sh run over the file opened here, as its standard input).

MAX_EDIT_FILE_BYTES = 256 * 1024 * 1024


def normalize(s):
    return s.replace("\r\n", "\n").replace("\r", "\n")


def edit(out, a):
    """REL OLD NEW ALL(0/1) TMPNAME: `R` and edit.py's JSON answer (a count or an error)."""
    import json

    def result(**fields):
        out.append("R " + json.dumps(fields))

    rel, flag, tmp = a[0], a[3], a[4]
    try:
        old, new = a[1].decode("utf-8"), a[2].decode("utf-8")
    except UnicodeDecodeError:
        return result(error="invalid_args", message="arguments must be UTF-8 text")
    if flag not in (b"0", b"1"):
        return result(error="invalid_args", message="replace_all must be 0 or 1")
    if not old:
        return result(error="invalid_args", message="the string to replace is empty")
    try:
        dirs, name = resolve(rel, True)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return result(error="not_found")
        raise
    try:
        if name is None:
            return result(error="read_failed", message="not a regular file, or too large")
        dfd = dirs[-1]
        try:
            fd = fd_open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return result(error="not_found")
            return result(error="read_failed", message=os.strerror(e.errno or errno.EIO))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_EDIT_FILE_BYTES:
                return result(error="read_failed", message="not a regular file, or too large")
            parts = []
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                parts.append(b)
        finally:
            fd_close(fd)
        try:
            content = b"".join(parts).decode("utf-8")
        except UnicodeDecodeError as e:
            return result(error="read_failed", message=str(e))
        content, old, new = normalize(content), normalize(old), normalize(new)
        count = content.count(old)
        if count == 0:
            return result(error="string_not_found")
        if count > 1 and flag != b"1":
            return result(error="multiple_occurrences", count=count)
        updated = content.replace(old, new) if flag == b"1" else content.replace(old, new, 1)
        try:
            t = fd_open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            try:
                write_at(t, updated.encode("utf-8"), 0)
                os.fchmod(t, st.st_mode & 0o7777)
                try:
                    os.fchown(t, st.st_uid, st.st_gid)
                except OSError:
                    pass  # not root: the file becomes ours, as an editor's save would make it
                os.fsync(t)
            finally:
                fd_close(t)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as e:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            return result(error="write_failed", message=os.strerror(e.errno or errno.EIO))
        try:
            d = fd_open(".", os.O_RDONLY | DIR, dir_fd=dfd)
            try:
                os.fsync(d)
            finally:
                fd_close(d)
        except OSError:
            pass
        result(count=count if flag == b"1" else 1)
    finally:
        close(dirs)


def scan(out, a):
    """REL START END MAX SCRIPT: `W` and scan.sh's output (base64), the script reading the file
    opened here through /dev/stdin (each open of it is of that file, whatever its name is
    made to lead to meanwhile)."""
    import subprocess

    rel, args, script = a[0], a[1:4], a[4]

    def said(text):
        out.append("W " + b64(text))

    try:
        dirs, name = resolve(rel, True)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return said(b"ERR not_found no such file\n")
        raise
    try:
        if name is None:
            return said(b"ERR is_a_directory is a directory\n")
        try:
            fd = fd_open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirs[-1])
        except OSError as e:
            if e.errno == errno.ENOENT:
                return said(b"ERR not_found no such file\n")
            return said(b"ERR io_error cannot read\n")
    finally:
        close(dirs)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return said(b"ERR io_error not a regular file\n")
        run = subprocess.Popen(
            [b"sh", b"-c", script, b"scan.sh", b"/dev/stdin"] + list(args),
            stdin=fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        text = run.communicate()[0]
        said(text)
    finally:
        fd_close(fd)


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
        elif OP == "ns":
            ns(out, args)
        elif OP == "commit":
            commit(out, args)
        elif OP == "xattr":
            xattr(out, args)
        elif OP == "edit":
            edit(out, args)
        elif OP == "scan":
            scan(out, args)
        else:
            raise Fail("EINVAL", "unknown operation")
    except Fail as f:
        # One ASCII line, whatever a name in it holds.
        text = f.text.encode("ascii", "backslashreplace").decode("ascii").replace("\n", " ")
        put("\n__RESULT__\nerr %s %s\n" % (f.token, text))
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
