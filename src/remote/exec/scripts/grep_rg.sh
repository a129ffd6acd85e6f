# grep_rg REL MIN_MAJOR PARENTS NWALK ARGS...: ripgrep runs the search in the sandbox; only
# the listing of searched files and rg's JSON cross. ARGS: NWALK walk options (they also
# serve `rg --files`), then the search options and the pattern. Answers "F REASON" when rg
# cannot give the agent's answer exactly here (no rg, too old, the root not a plain
# directory, ignore files above the workspace or .git/info/exclude at its top, which rg
# would read and the agent does not); the caller then searches locally.
# Otherwise: "L " + base64 of `rg --files --null`, "LRC" its status, "J", rg's JSON lines,
# "JRC" rg's status.
at "$1"
__min=$2
__par=$3
__nw=$4
shift 4
__fb() {
  ok
  echo "F $1"
  exit 0
}
command -v rg >/dev/null 2>&1 || __fb no-rg
__v=$(rg --version 2>/dev/null | sed -n '1s/^ripgrep \([0-9][0-9]*\).*/\1/p')
[ -n "$__v" ] || __fb no-rg
[ "$__v" -ge "$__min" ] || __fb old-rg
canon "$P"
[ -n "$R" ] && [ "$R" = "$P" ] && [ -d "$P" ] || __fb not-a-plain-directory
if [ "$__par" = 1 ]; then
  [ -e "$ROOT/.git/info/exclude" ] && __fb git-exclude
  __d=$ROOT
  while [ -n "$__d" ]; do
    __d=${__d%/*}
    for __n in .gitignore .ignore .rgignore; do
      [ -e "$__d/$__n" ] && __fb ignore-files-above
    done
  done
fi
cd "$P" || __fb cd
# Where the cd led (a directory swapped for a symlink since the check leads elsewhere): the
# search runs from this held directory, or not at all (the local search reads by descriptor).
[ "$(pwd -P)" = "$P" ] || __fb moved
# rg --files with the first NWALK arguments only.
__files() {
  __o=$#
  __i=0
  for __a do
    __i=$((__i + 1))
    [ "$__i" -le "$__nw" ] && set -- "$@" "$__a"
  done
  shift "$__o"
  rg --files --null "$@"
}
ok
printf 'L '
{ __frc=$({ { __files "$@"; echo $? >&3; } | base64 | tr -d '\n' >&4; } 3>&1); } 4>&1
echo
echo "LRC $__frc"
echo J
rg --json "$@"
echo "JRC $?"
