//! `GET /v1/tree?format=packed&max=N`: a subtree's listings breadth first, in the packed
//! encoding ([`crate::remote::treepack`]), walked by the same rule every backend follows
//! ([`crate::remote::listings::Walk`]). Runs on a producer thread; stops as soon as the
//! client has gone (a send fails).

use crate::remote::listings::Walk;
use crate::remote::treepack::{Encoder, Trailer};
use crate::remote::wire::ErrorBody;
use crate::remote::{DirEntry, RemotePath, Result};

use super::workspace::Workspace;

/// Entries encoded before the compressed bytes so far are handed to the network: a few
/// round trips' worth of a fast link, so the client decodes while the agent walks on.
const ENTRIES_PER_CHUNK: usize = 2048;

/// Walk `path` and hand each compressed chunk to `send` (which answers `false` once the
/// client is gone). Errors after the first listing end the answer in its end record. With
/// the trailer, each entry says whether it has extended attributes and when it was born.
pub fn packed(
    ws: &Workspace,
    path: &RemotePath,
    max_entries: usize,
    trailer: Trailer,
    send: &mut dyn FnMut(Vec<u8>) -> bool,
) {
    let mut enc = Encoder::with(trailer);
    let error = match walk(ws, path, max_entries, &mut enc, send) {
        Ok(true) => None,
        Ok(false) => return,
        Err(e) => Some(ErrorBody::from_error(&e)),
    };
    enc.end(error.as_ref());
    send(enc.finish());
}

fn walk(
    ws: &Workspace,
    path: &RemotePath,
    max_entries: usize,
    enc: &mut Encoder,
    send: &mut dyn FnMut(Vec<u8>) -> bool,
) -> Result<bool> {
    let mut walk = Walk::new(path, max_entries);
    let mut since_send = 0;
    let mut first = true;
    while let Some(dir) = walk.next_dir().cloned() {
        // Past the first listing, stop gathering once it cannot fit anyway.
        let limit = if first { usize::MAX } else { max_entries + 1 };
        let mut entries: Vec<DirEntry> = Vec::new();
        let listed = ws.list_each(&dir, &mut |e| {
            entries.push(e);
            entries.len() < limit
        });
        match listed {
            Ok(()) => {
                if !walk.listed(&entries)? {
                    break;
                }
                enc.listing(&entries);
                since_send += entries.len();
            }
            Err(e) if first => return Err(e),
            // Gone or unreadable meanwhile: the client lists it itself and sees why.
            Err(_) => {
                walk.skipped();
                enc.skipped();
            }
        }
        first = false;
        if since_send >= ENTRIES_PER_CHUNK {
            since_send = 0;
            if !send(enc.take()) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}
