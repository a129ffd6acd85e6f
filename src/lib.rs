//! sbxfs: mount a remote sandbox's workspace locally, with search that runs inside the sandbox.
//!
//! # Modules
//! - [`search`]: the pure search and edit core (`scan`, `glob`, `grep`, `fuzzy`, `edit`), no
//!   FUSE or network dependency; pinned by the shared vectors in `tests/vectors/`.
//! - [`atomic`]: atomic replacement of a file (temp file beside the target, fsync, rename).
//! - [`cli`]: the `sbxfs` command line; `main.rs` only calls [`cli::main`].
//!
//! # The path of a query
//! `sbxfs grep PATTERN DIR` parses its flags into [`search::grep::GrepOptions`], walks `DIR`
//! once with ripgrep's `ignore` walker ([`search::walk`]), searches each file with
//! `grep-searcher`, and streams each match to a sink that prints it (or stops the search at a
//! cap). `scan` streams the file through [`search::scan::LineWindow`] in 64 KiB positional
//! reads; `edit` replaces in memory and writes through [`atomic`].
//!
//! # Not yet built
//! The `Remote` trait, the agent, the FUSE mount and the control socket are the next steps
//! (issues 3–5); this crate doc grows with them.

pub mod agent;
pub mod atomic;
pub mod cli;
pub mod proxy;
pub mod remote;
pub mod search;
pub mod wirebytes;
