# pystat.sh: where the sandbox's own stat knows whole seconds only (busybox) and python runs,
# `stat -c FORMAT [-L] -- PATH...` is answered by python with nanosecond times, so every
# script's attribute lines and versions match the fast path's (scripts/fast.py). Set before
# this: __PY (the probed python, a fixed word). Other uses of stat (stat -f) are the tool's.
__pystat='import os, sys
a = sys.argv[1:]
follow = False
fmt = ""
while a:
    x = a.pop(0)
    if x == "-L":
        follow = True
    elif x == "-c":
        fmt = a.pop(0)
    elif x == "--":
        break
    else:
        a.insert(0, x)
        break
def t(ns, frac):
    if not frac:
        return "%d" % (ns // 1000000000)
    n = abs(ns)
    return "%s%d.%09d" % ("-" if ns < 0 else "", n // 1000000000, n % 1000000000)
rc = 0
for p in a:
    try:
        st = os.stat(p) if follow else os.lstat(p)
    except OSError as e:
        sys.stderr.write("stat: cannot stat: %s\n" % os.strerror(e.errno))
        rc = 1
        continue
    times = {"X": st.st_atime_ns, "Y": st.st_mtime_ns, "Z": st.st_ctime_ns}
    v = {"f": "%x" % st.st_mode, "s": "%d" % st.st_size, "u": "%d" % st.st_uid,
         "g": "%d" % st.st_gid, "d": "%d" % st.st_dev, "i": "%d" % st.st_ino,
         "h": "%d" % st.st_nlink, "t": "%x" % os.major(st.st_rdev),
         "T": "%x" % os.minor(st.st_rdev), "a": "%o" % (st.st_mode & 0o7777), "%": "%"}
    out = []
    i = 0
    while i < len(fmt):
        if fmt[i] != "%":
            out.append(fmt[i])
            i += 1
        elif fmt.startswith("%.9", i) and fmt[i + 3:i + 4] in times:
            out.append(t(times[fmt[i + 3]], True))
            i += 4
        elif fmt[i + 1:i + 2] in times:
            out.append(t(times[fmt[i + 1]], False))
            i += 2
        else:
            out.append(v[fmt[i + 1]])
            i += 2
    sys.stdout.write("".join(out) + "\n")
sys.exit(rc)
'
stat() {
  case $1 in
  -c | -L) "$__PY" -c "$__pystat" "$@" ;;
  *) command stat "$@" ;;
  esac
}
