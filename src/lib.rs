//! sbxfs: mount a remote sandbox's workspace locally, with search that runs inside the sandbox.
//!
//! # Modules
//! - [`search`]: the pure search and edit core (`scan`, `glob`, `grep`, `fuzzy`, `edit`), no
//!   FUSE or network dependency; pinned by the shared vectors in `tests/vectors/`.
//! - [`remote`]: the [`remote::Remote`] trait every sandbox backend implements, its error type
//!   (mapped to errno in one place), the agent protocol ([`remote::wire`]) and its HTTP client.
//! - [`agent`]: `sbxfs agent`, the HTTP server that runs inside a sandbox; every path confined
//!   to its root by `openat2(RESOLVE_BENEATH)` ([`agent::workspace`]); a change feed
//!   ([`agent::watch`]).
//! - [`atomic`]: atomic replacement of a local file (used by the CLI's `edit`).
//! - [`proxy`]: a delaying, byte-counting TCP proxy for tests and benchmarks.
//! - [`cli`]: the `sbxfs` command line; `main.rs` only calls [`cli::main`].
//!
//! # The path of a read
//! A client calls [`remote::Remote::read`]; the agent opens the path beneath its root, reads the
//! range with `pread`, and answers the bytes with the version (inode, size, mtime, ctime) they
//! came from, re-reading if the file changed in place meanwhile.
//!
//! # The path of a write
//! [`remote::Remote::commit`] streams the new content (or a patch of byte ranges over a named
//! base version) to the agent, which writes a temp file beside the target, fsyncs it, checks the
//! base version once more and renames it over the target: readers in the sandbox see the old or
//! the new file, never a mix; a stale base is a conflict that changes nothing.
//!
//! # The path of a query
//! `sbxfs grep PATTERN DIR` (or the agent's `/v1/grep`) walks the tree once with ripgrep's
//! `ignore` walker ([`search::walk`]), searches files in parallel with `grep-searcher`, and
//! streams matches in walk order to a sink that can stop the search (a cap, or a client gone).
//! `scan` streams a file through [`search::scan::LineWindow`] in 64 KiB positional reads.
//!
//! # Consistency
//! The agent's answers are the sandbox's state at the time of each call; versions let a client
//! tell whether what it cached is still current, and the change feed tells it when to look.
//! (The mount's caches and close-to-open consistency are the next step.)

pub mod agent;
pub mod atomic;
pub mod cli;
pub mod mount;
pub mod proxy;
pub mod remote;
pub mod search;
pub mod wirebytes;
