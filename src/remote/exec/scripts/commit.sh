# commit REL BASE CMODE TMPNAME: a new content (the function `content TEMP`, defined before)
# replaces REL's atomically. BASE: "" (no check), "absent" (create only) or the version
# fields ($VF) the file must still have. CMODE: the mode of a file the commit creates.
at "$1"
follow
[ -d "$P" ] && fail EISDIR "$1"
D=${P%/*}
T=$D/$4
# UP: bytes the transport uploaded (put_file), removed whatever happens.
trap 'rm -f -- "$T" ${UP:+"$UP"}' EXIT
if ! o=$( (set -C && : >"$T") 2>&1); then fail SYS "$o"; fi
if ! o=$(content "$T" 2>&1); then fail SYS "$T: $o"; fi
# MTIME: the time of the last write through the mount (a touch that cannot: the commit's).
[ -z "${MTIME:-}" ] || touch -m -d "$MTIME" -- "$T" 2>/dev/null || :
if [ -e "$P" ] || [ -L "$P" ]; then
  cur=$(stat -c "$VF" -- "$P" 2>&1) || fail SYS "$cur"
else
  cur=absent
fi
[ -z "$2" ] || [ "$cur" = "$2" ] || fail CONFLICT "$cur"
if [ "$cur" = absent ]; then
  chmod "$3" -- "$T" || fail EIO "$T: chmod failed"
else
  # The new content keeps the file's extended attributes where cp can copy them (GNU).
  cp --attributes-only --preserve=xattr -- "$P" "$T" 2>/dev/null || :
  # And its owner, where the shell may give it (as root): before the mode, which a chown
  # would strip of its set-id bits.
  o=$(stat -c %u:%g -- "$P") && chown "$o" -- "$T" 2>/dev/null || :
  m=$(stat -c %a -- "$P") && chmod "$m" -- "$T" || fail EIO "$T: chmod failed"
fi
if [ "$cur" = absent ]; then
  # ln refuses to replace a name (create only, even when one appears meanwhile).
  if ! o=$(ln -- "$T" "$P" 2>&1); then
    if [ -e "$P" ] || [ -L "$P" ]; then fail CONFLICT "$(stat -c "$VF" -- "$P" 2>&1)"; fi
    fail SYS "$o"
  fi
  rm -f -- "$T"
elif [ "$(stat -c %h -- "$P")" -gt 1 ]; then
  # Other hard links would lose the new content to a rename: copy into the inode.
  if ! o=$( { cat -- "$T" >"$P"; } 2>&1); then fail SYS "$o"; fi
  [ -z "${MTIME:-}" ] || touch -m -d "$MTIME" -- "$P" 2>/dev/null || :
  rm -f -- "$T"
else
  if ! o=$(mv -f -- "$T" "$P" 2>&1); then fail SYS "$o"; fi
fi
[ -z "${UP:-}" ] || rm -f -- "$UP"
trap - EXIT
ok
attrs "$P"
[ -z "${COPIED:-}" ] || echo "C $COPIED"
