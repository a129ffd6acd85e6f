//! sbxfs: mount a remote sandbox's workspace locally, with search that runs inside the sandbox.
//!
//! # Modules
//! - [`search`]: the pure search and edit core (`scan`, `glob`, `grep`, `fuzzy`, `edit`), no
//!   FUSE or network dependency; pinned by the shared vectors in `tests/vectors/`.
//! - [`remote`]: the [`remote::Remote`] trait every sandbox backend implements, its error type
//!   (mapped to errno in one place), the agent protocol ([`remote::wire`]) and its HTTP(S)
//!   client; [`remote::reach`] classifies a first contact's failure into one line and exit code.
//!   [`remote::connect`] turns a URL into a connected `Remote` (the transport chosen by scheme;
//!   http(s) with [`remote::httpsetup`]'s extra CAs and headers), each wrapped in the one
//!   retry ([`remote::retry`]: idempotent calls after a transport failure) and deadline layer.
//!   [`remote::layer`]: wrappers as layers: one [`remote::layer::Op`] table (idempotent or
//!   not, time bound) and one forwarder ([`remote::layer::Layered`]) for retry, deadlines,
//!   injected faults, the ssh relink and the calls counted by operation ([`remote::counted`],
//!   which the mount's `ctl stats` shows).
//!   `remote::memory`: a whole sandbox in memory, the reference backend for tests (with a
//!   sandbox-side API to change files behind the mount's back); built only for tests (the
//!   `test-support` feature, which the tests turn on), never into a release binary.
//!   [`remote::source_query`]: grep, glob and fuzzy over a tree held in memory
//!   ([`search::snapshot`], what a transport without an agent lists), as the agent answers.
//!   [`remote::faulty`]: a wrapper around any `Remote` injecting latency, errors, hangs, cut streams.
//!   [`remote::listings`]: a subtree's listings breadth first under a cap (what every backend
//!   answers for `tree_listings`); [`remote::treepack`]: the agent's packed, compressed
//!   encoding of them. [`remote::ssh`]: `ssh://`, over the user's OpenSSH (one ControlMaster): a
//!   self-deployed agent on a Unix socket reached through an ssh forwarding (made again after
//!   a drop, `remote::ssh::relink`), or over an ssh session where the server refuses
//!   forwarding, else the exec-only scripts. [`remote::stdio`]: the agent over any exec
//!   channel's standard input and output (`shell:`, `exec:`): deployed through the channel by an
//!   `sh` probe and upload, then one session per client connection (`agent --stdio`, HTTP/2)
//!   bridged from a private Unix socket.
//!   [`remote::exec`]: sandboxes reached only through a shell (`?agent=no`, or no agent can
//!   run there): every
//!   operation a static POSIX `sh` program with base64 arguments over a [`remote::exec::Runner`]
//!   ([`remote::exec::remote::ScriptRemote`]), through one session per mount
//!   ([`remote::exec::session`]); with python3 there, every operation on a path (metadata,
//!   reads, commits, namespace changes, xattrs) by one python script walking directory
//!   descriptors ([`remote::exec::pyfast`]), which the session's python3 server runs itself; grep by `rg --json` in the sandbox where it is
//!   ([`remote::exec::rgjson`]), else matched here; glob/fuzzy matched here over what it lists.
//!   [`remote::exec::supervise`]: every exec-only program runs in its own process group under a
//!   supervising `sh` (cancel, timeout or a dropped run stops the whole group; secrets reach it
//!   through a 0600 file in a private in-memory job directory, never an argv).
//! - [`agent`]: `sbxfs agent`, the HTTP server that runs inside a sandbox; every path confined
//!   to its root by `openat2(RESOLVE_BENEATH)` ([`agent::workspace`]), its searches walking
//!   beneath the root's descriptor ([`search::beneath`]) under a deadline and cancelled when
//!   their client leaves ([`search::cancel`]); Landlock as a second wall ([`agent::confine`]);
//!   a change feed over real directories only ([`agent::watch`]); the files mounts read, held
//!   open for them ([`agent::held`]); its own accept loop bounding
//!   connections, header reads and idle time ([`agent::server`]), on TCP or a Unix socket, https
//!   when given a certificate ([`agent::tls`]).
//! - [`mount`]: `sbxfs mount`, a FUSE filesystem over any `Remote`: a thin adapter
//!   ([`mount::fuse`]: decode, one call, reply) over the gated filesystem ([`mount::gated`]),
//!   which runs the permission gate ([`mount::gate`], the POSIX rules in [`mount::access`]; the
//!   mounting user acting as the sandbox's user, whose owners the mount shows) and then the
//!   filesystem operations ([`mount::core`]), and returns reply-ready answers (attributes as
//!   shown, with their TTLs), so gate, TTL and owner policy are unit-tested without a kernel.
//!   `FsCore` is a façade: its fields are private to `mount/core/`, whose files are its
//!   operations (`mod.rs`: lookups, reads, writes, namespace calls; `push.rs`: write-back;
//!   `first_push.rs`: names of files not pushed yet; `changes.rs`: the one `apply(Change)`
//!   through which the feed's events and revalidations change caches; `subtree.rs`:
//!   a directory's first look; `read_ahead.rs`; `xattr_hint.rs`), over components that own
//!   their state behind their own API:
//!   the sandbox as reached ([`mount::sandbox`]: its `Remote`, whether and how fast it
//!   answers, what its `info` said), the inode table ([`mount::inode`]: own node ids, names as
//!   links, orphans, the epoch rule that keeps answers older than a local change out),
//!   listings ([`mount::meta`]; a directory's first look fetches its subtree's in one packed
//!   answer, [`mount::subtree`], subdirectories' kept by path until their nodes exist,
//!   [`mount::prefetch`]), the page cache ([`mount::pages`], with its disk tier per sandbox,
//!   [`mount::disk_pages`], for remounts) filled ahead of sequential
//!   readers ([`mount::readahead`]), open handles ([`mount::handles`]), the write-back state
//!   ([`mount::writeback`]: which files are staged and their writers, failures kept, conflict
//!   copies; each staged file with an explicit state on its way to the sandbox,
//!   [`mount::lifecycle`]: clean, dirty, queued, pushing, retrying, refused-kept, conflict),
//!   pushes queued by `close` ([`mount::pushq`]), new files created by their first push
//!   ([`mount::newfiles`]), durable staged images ([`mount::staging`]) in a private directory
//!   ([`mount::state`]), the change feed follower's state ([`mount::feed`]: how long
//!   caches are trusted), and the echo thread's ([`mount::echo`]: sandbox-side changes
//!   repeated on the mountpoint for local inotify watchers, answered by `core/echo.rs` from
//!   the caches alone, and streamed to `sbxfs watch`). TTLs count in an injectable clock ([`mount::clock`]). Every remote
//!   call has a deadline ([`remote::deadline`]), and every answer is bounded before it is held
//!   (the client parses JSON as it streams, with caps on size, entries and names; a read
//!   answer is never longer than asked). Symlink targets are shown so none leads out of the
//!   mount ([`mount::links`]). Around them: the daemon side of the control socket
//!   ([`mount::control_server`]), the sandbox's reachability as last probed for `ctl status`
//!   ([`mount::health`]), `-o` options ([`mount::options`]) and what mountinfo says
//!   ([`mount::mounts`]). Starting: checks before anything is made ([`mount::preflight`]), the
//!   `fuse.sbxfs` mount itself ([`mount::kernel`]), readiness for systemd
//!   ([`mount::notify`]), the background form that `mount -t fuse.sbxfs` runs
//!   ([`mount::background`]) and the exit codes ([`mount::exit`]).
//! - [`control`]: the mount's control surface as a protocol: the INFO/QUERY ioctl numbers and
//!   codec, the control socket's requests and location, and the CLI's client; one versioned
//!   protocol shared by the daemon and the CLI, so `sbxfs grep` in a mount runs in the sandbox.
//! - [`lograte`]: repeated failures logged once a minute with a count.
//! - [`atomic`]: atomic replacement of a local file (used by the CLI's `edit`).
//! - [`proxy`]: a delaying, byte-counting TCP proxy for tests and benchmarks.
//! - [`cli`]: the `sbxfs` command line (query, daemon and ctl commands, logging set-up, help,
//!   completions and man page from one clap definition); `main.rs` only calls [`cli::main`].
//!
//! # The path of a read
//! `read(2)` in the mount reaches [`mount::fuse`], which hands it to a task calling
//! [`mount::gated::GatedFs::read`] and so [`mount::core::FsCore::read`]: a file with staged writes is read from its staged image
//! (base pages fetched on demand); otherwise the file's current version (revalidated at `open`)
//! and the page index key the page cache (memory, then the sandbox's pages on disk); a miss
//! calls [`remote::Remote::read_held`] with the
//! handle's version, and the agent reads the file it holds open under that path and version
//! ([`agent::held`]: a file replaced or removed since keeps its bytes for its reader), else
//! opens the path beneath its root; it `pread`s the range and answers the bytes with the
//! version (device, inode, size, mtime, birth time) they came from. The reply goes through
//! [`mount::kernel_notes`], which orders it with the kernel invalidations and attribute answers
//! of that file, so a read that a rewrite in the sandbox cut short ends the file there.
//!
//! # The path of a write
//! `write(2)` goes to the node's staged image ([`mount::staging`]; a journal line records it),
//! fetching nothing. `close` (of a descriptor that wrote) and the last close queue a push
//! ([`mount::pushq`]: up to 16 in flight, in order per file; a new file's first push settles
//! 25 ms, so a rename or unlink right after its close withdraws it and stays local, the push
//! going to the final name, and the rename returning once it landed; `-o sync_close` waits),
//! `fsync`
//! pushes and waits ([`mount::writeback`]): [`remote::Remote::commit`] streams a patch — where the file was cut,
//! its final length, the dirty ranges — or the whole file, naming the base version (a new
//! sparse file is a patch cut to nothing where the transport says `patch_new`); the agent
//! writes a temp file beside the target, fsyncs it, checks the base version once more and
//! renames it over the target (a file with several hard links is written in place). Readers in the sandbox see the old or the new file, never a mix; a stale base is a
//! conflict that changes nothing, and the mount saves the user's version as a conflict copy.
//! The mount knows its own changes: a push's answer rebinds the node at a new epoch
//! ([`mount::inode::InodeTable::rebind_own`]), and any stat, lookup or feed answer asked for
//! before that epoch is older than what the mount knows and is not applied, so the mount's own
//! save never comes back as "replaced in the sandbox". The node keeps the `st_ino` it showed.
//! A directory holding a file not pushed yet is not empty to `rmdir`; setting a directory's
//! times first lands the pushes of what was made in it. A commit carries the staged mtime (the
//! push does not move the time programs saw), and an access time set before it where the
//! transport says `commit_atime`; the agent copies the file's extended
//! attributes onto the new content. A failed push keeps its cause (`ENOSPC`, `EROFS`, …) for
//! the writer's `fsync`/`close`; the file's state, its cause and any conflict copy are shown
//! by `ctl status`, `ctl flush` and `sbxfs umount`.
//!
//! # The path of a query
//! `sbxfs grep PATTERN` standing in a mount asks the directory for its mount ([`control`]'s
//! INFO ioctl), sends the query on the mount's control socket
//! ([`mount::control_server`]); the daemon pushes unpushed
//! writes, then streams the agent's `/v1/grep` answer back (given up once the mount's probe
//! finds the sandbox hung, [`mount::health`]). In the sandbox (or on a local path)
//! the core does the work: it walks the tree once with ripgrep's
//! `ignore` walker ([`search::walk`]), searches files in parallel with `grep-searcher`, and
//! streams matches in walk order to a sink that can stop the search (a cap, or a client gone);
//! text output is ripgrep's own printer set up as `rg --sort path` ([`search::print`]), printed
//! per file in the sandbox with the paths as the user gave them.
//! `scan` streams a file through [`search::scan::LineWindow`] in 64 KiB positional reads.
//!
//! # Consistency
//! Close-to-open: `open` revalidates the version; `fsync` returns once the sandbox has the data,
//! `close` once the push is queued (namespace operations, `ctl flush`, queries and unmount wait
//! for the queued pushes they could overtake). Data pages are keyed by version so they are
//! never stale. While the agent's change feed ([`agent::watch`]) is connected, [`mount::feed`]
//! follows it: attributes, listings and pages are trusted indefinitely (here and in the kernel;
//! `open` does not revalidate), and each event drops what it touches once a batched stat
//! ([`remote::Remote::stat_many`]) shows its version changed; the mount's own commits and
//! the names it made, removed or renamed come back marked as its own
//! ([`remote::wire::CLIENT_HEADER`]) and are not checked. What inotify does not report (a
//! write through a shared mmap or an outside hard link) is found by re-checking every known
//! file in batched rounds, all within `-o recheck_s`. When the feed drops or loses
//! events, the TTL applies again at once and every cached path is revalidated before the feed
//! is trusted again; a remote without a feed keeps the TTL.

pub mod agent;
pub mod atomic;
pub mod cli;
pub mod control;
pub mod lograte;
pub mod mount;
pub mod proxy;
pub mod remote;
pub mod search;
pub mod wirebytes;
