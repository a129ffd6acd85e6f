//! `FaultyRemote`: failure injection around any `Remote` (in progress).
