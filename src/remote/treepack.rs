//! The packed tree encoding (`GET /v1/tree?format=packed&max=N`, answered with
//! [`CONTENT_TYPE`]): a subtree's listings, breadth first, each name relative to its directory
//! and each attribute as a few varints, the whole deflate-compressed. About a tenth of the
//! bytes of the JSON listings for a source tree.
//!
//! The body is a raw deflate stream of records, each `varint(len) payload`; a payload starts
//! with its tag:
//! - `L varint(n)`: the listing of the next directory follows, `n` `F` records;
//! - `F entry`: one entry (see [`put_entry`]);
//! - `S`: the next directory is skipped (it vanished or could not be read meanwhile);
//! - `E varint(0 | 1 + len) [error]`: the end, with an optional [`super::wire::ErrorBody`] as
//!   JSON.
//!
//! With `xattrs=1` in the query, each `F` record ends with one more byte: 0 the entry has no
//! extended attribute, 1 it has some, 2 unknown. An older agent ignores the parameter and
//! sends none (unknown); an older client never asks, so never sees the byte. With `born=1` as
//! well, the byte is followed by the birth time (zigzag varint, 0 not known); a record that
//! ends at the byte has none.
//!
//! "The next directory": directory 0 is the one asked for; each `F` of kind directory numbers
//! the next one, in stream order, and listings (`L` or `S`) come in that order. Directories
//! numbered but neither listed nor skipped at `E` were not descended (the size cap): the
//! client lists them lazily. No path is ever repeated, so a deep tree costs no more per entry
//! than a flat one.
//!
//! The decoder holds at most one record and [`DECODE_STEP`]'s worth of inflated bytes at a
//! time, whatever the compressed stream claims (a deflate bomb inflates step by step).

use std::collections::VecDeque;
use std::io::Write;

use super::client::MAX_DIR_ENTRIES;
use super::listings::{TreeListing, MAX_TREE_ENTRIES};
use super::wire::ErrorBody;
use super::{
    check_entry_name, Attr, DirEntry, FileKind, RemoteError, RemotePath, Result, Version, WireBytes,
};

pub const CONTENT_TYPE: &str = "application/x-sbxfs-tree";
/// The query value asking for this encoding; `/v1/info`'s `tree_formats` lists it.
pub const FORMAT: &str = "packed";
/// The query parameter (`=1`) asking for each entry's has-xattrs byte.
pub const XATTRS_PARAM: &str = "xattrs";
/// The query parameter (`=1`, with [`XATTRS_PARAM`]) asking for each entry's birth time.
pub const BORN_PARAM: &str = "born";
/// Longest record: a 255-byte name, a 4 KiB symlink target, a version and the numbers fit
/// well within it; anything longer is a broken or hostile agent.
pub const MAX_RECORD: usize = 16 * 1024;
/// Compressed bytes fed to the inflater at once: at deflate's ratio limit (~1032:1) this is
/// at most 4 MiB inflated before records are parsed out of it.
pub const DECODE_STEP: usize = 4096;

// --- writing

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// `None` as 0, else 1 + length then the bytes.
fn put_opt_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => put_varint(out, 0),
        Some(b) => {
            put_varint(out, b.len() as u64 + 1);
            out.extend_from_slice(b);
        }
    }
}

fn kind_code(k: FileKind) -> u8 {
    match k {
        FileKind::File => 0,
        FileKind::Dir => 1,
        FileKind::Symlink => 2,
        FileKind::Fifo => 3,
        FileKind::Socket => 4,
        FileKind::CharDevice => 5,
        FileKind::BlockDevice => 6,
        FileKind::Other => 7,
    }
}

fn kind_of(c: u8) -> Option<FileKind> {
    Some(match c {
        0 => FileKind::File,
        1 => FileKind::Dir,
        2 => FileKind::Symlink,
        3 => FileKind::Fifo,
        4 => FileKind::Socket,
        5 => FileKind::CharDevice,
        6 => FileKind::BlockDevice,
        7 => FileKind::Other,
        _ => return None,
    })
}

/// The version the agent gives a file (device, inode, size, mtime, and the birth time where
/// known): sent as "derived" instead of spelled out when an attribute's version is exactly
/// this.
pub fn derived_version(a: &Attr) -> Version {
    version_from(a.dev, a.ino, a.size, a.mtime_ns, a.born_ns)
}

/// The version of a file with these numbers (a birth time of 0, not known, adds nothing: the
/// form older agents give).
pub fn version_from(dev: u64, ino: u64, size: u64, mtime_ns: i64, born_ns: i64) -> Version {
    let numbers = format!(
        "{:x}:{:x}-{ino:x}-{size:x}-{mtime_ns:x}",
        libc::major(dev as libc::dev_t),
        libc::minor(dev as libc::dev_t),
    );
    Version(if born_ns == 0 {
        numbers
    } else {
        format!("{numbers}-{born_ns:x}")
    })
}

/// One entry: name, kind byte, then size, mode, uid, gid, zigzag atime, mtime, ctime, dev,
/// ino, nlink, rdev as varints, the symlink target (optional bytes) and the version (optional
/// bytes, absent when it is [`derived_version`]), then with `xattrs` the has-xattrs byte, and
/// with `born` as well the birth time.
fn put_entry(out: &mut Vec<u8>, name: &[u8], a: &Attr, trailer: Trailer) {
    out.push(b'F');
    put_bytes(out, name);
    out.push(kind_code(a.kind));
    for v in [
        a.size,
        u64::from(a.mode),
        u64::from(a.uid),
        u64::from(a.gid),
    ] {
        put_varint(out, v);
    }
    for t in [a.atime_ns, a.mtime_ns, a.ctime_ns] {
        put_varint(out, zigzag(t));
    }
    for v in [a.dev, a.ino, a.nlink, a.rdev] {
        put_varint(out, v);
    }
    put_opt_bytes(out, a.symlink_target.as_ref().map(|t| t.0.as_slice()));
    // Derived by the reader from what it is sent: not when the birth time it was made with
    // is not sent.
    let derived = derived_version(a) == a.version && (a.born_ns == 0 || trailer.born);
    put_opt_bytes(out, (!derived).then_some(a.version.0.as_bytes()));
    if trailer.xattrs {
        out.push(match a.has_xattrs {
            Some(false) => 0,
            Some(true) => 1,
            None => 2,
        });
        if trailer.born {
            put_varint(out, zigzag(a.born_ns));
        }
    }
}

/// What each entry carries after its version: what the client asked for.
#[derive(Clone, Copy, Default)]
pub struct Trailer {
    /// The has-xattrs byte.
    pub xattrs: bool,
    /// The birth time (after the has-xattrs byte: only with it).
    pub born: bool,
}

/// Builds a packed answer: records are compressed as they are added; [`Encoder::take`] hands
/// out what is ready to send.
pub struct Encoder {
    z: flate2::write::DeflateEncoder<Vec<u8>>,
    record: Vec<u8>,
    trailer: Trailer,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    pub fn new() -> Self {
        Encoder {
            z: flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast()),
            record: Vec::new(),
            trailer: Trailer::default(),
        }
    }

    /// An encoder whose entries end with this trailer.
    pub fn with(trailer: Trailer) -> Self {
        Encoder {
            trailer,
            ..Self::new()
        }
    }

    fn record(&mut self, fill: impl FnOnce(&mut Vec<u8>)) {
        self.record.clear();
        fill(&mut self.record);
        let mut len = Vec::with_capacity(3);
        put_varint(&mut len, self.record.len() as u64);
        // Writing into a Vec cannot fail.
        let _ = self.z.write_all(&len);
        let _ = self.z.write_all(&self.record);
    }

    pub fn listing(&mut self, entries: &[DirEntry]) {
        self.record(|r| {
            r.push(b'L');
            put_varint(r, entries.len() as u64);
        });
        let trailer = self.trailer;
        for e in entries {
            self.record(|r| put_entry(r, &e.name.0, &e.attr, trailer));
        }
    }

    pub fn skipped(&mut self) {
        self.record(|r| r.push(b'S'));
    }

    /// The last record; [`Encoder::finish`] then gives the rest of the body.
    pub fn end(&mut self, error: Option<&ErrorBody>) {
        let json = error.map(|e| serde_json::to_vec(e).expect("serialisable"));
        self.record(|r| {
            r.push(b'E');
            put_opt_bytes(r, json.as_deref());
        });
    }

    /// Compressed bytes ready so far (flushed, so the client can use them at once).
    pub fn take(&mut self) -> Vec<u8> {
        let _ = self.z.flush();
        std::mem::take(self.z.get_mut())
    }

    pub fn finish(self) -> Vec<u8> {
        self.z.finish().unwrap_or_default()
    }
}

// --- reading

/// One item of a decoded answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Record {
    /// A listing of `n` entries begins.
    Listing(u64),
    Entry(DirEntry),
    Skipped,
    End(Option<RemoteError>),
}

/// A malformed answer: the sandbox answered, wrongly (`EIO`, not "unreachable").
fn bad(why: impl std::fmt::Display) -> RemoteError {
    RemoteError::Io(String::new(), format!("bad packed tree answer: {why}"))
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> Result<u8> {
        let (&b, rest) = self
            .0
            .split_first()
            .ok_or_else(|| bad("record too short"))?;
        self.0 = rest;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("varint longer than 64 bits"))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let n = usize::try_from(n).map_err(|_| bad("length"))?;
        if n > self.0.len() {
            return Err(bad("length past the record"));
        }
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(a)
    }

    fn opt_bytes(&mut self) -> Result<Option<&'a [u8]>> {
        match self.varint()? {
            0 => Ok(None),
            n => self.take(n - 1).map(Some),
        }
    }

    fn u32(&mut self) -> Result<u32> {
        u32::try_from(self.varint()?).map_err(|_| bad("number out of range"))
    }
}

fn entry(c: &mut Cursor) -> Result<DirEntry> {
    let n = c.varint()?;
    let name = c.take(n)?.to_vec();
    check_entry_name(&name).map_err(|why| bad(format!("an impossible name: {why}")))?;
    let kind = kind_of(c.byte()?).ok_or_else(|| bad("unknown kind"))?;
    let size = c.varint()?;
    let (mode, uid, gid) = (c.u32()?, c.u32()?, c.u32()?);
    let atime_ns = unzigzag(c.varint()?);
    let mtime_ns = unzigzag(c.varint()?);
    let ctime_ns = unzigzag(c.varint()?);
    let (dev, ino, nlink, rdev) = (c.varint()?, c.varint()?, c.varint()?, c.varint()?);
    let symlink_target = c.opt_bytes()?.map(|t| WireBytes(t.to_vec()));
    let version = c
        .opt_bytes()?
        .map(|v| String::from_utf8_lossy(v).into_owned());
    let has_xattrs = match c.0.first() {
        None => None,
        Some(_) => match c.byte()? {
            0 => Some(false),
            1 => Some(true),
            2 => None,
            b => return Err(bad(format!("has-xattrs byte {b}"))),
        },
    };
    let born_ns = match c.0.first() {
        None => 0,
        Some(_) => unzigzag(c.varint()?),
    };
    let mut attr = Attr {
        kind,
        size,
        mode,
        uid,
        gid,
        atime_ns,
        mtime_ns,
        ctime_ns,
        dev,
        ino,
        born_ns,
        nlink,
        rdev,
        symlink_target,
        version: Version(String::new()),
        has_xattrs,
    };
    attr.version = match version {
        Some(v) => Version(v),
        None => derived_version(&attr),
    };
    Ok(DirEntry {
        name: WireBytes(name),
        attr,
    })
}

fn record(payload: &[u8]) -> Result<Record> {
    let mut c = Cursor(payload);
    let r = match c.byte()? {
        b'L' => Record::Listing(c.varint()?),
        b'F' => Record::Entry(entry(&mut c)?),
        b'S' => Record::Skipped,
        b'E' => Record::End(match c.opt_bytes()? {
            None => None,
            Some(json) => Some(
                serde_json::from_slice::<ErrorBody>(json)
                    .map_err(|e| bad(format!("end record: {e}")))?
                    .into_error(),
            ),
        }),
        t => return Err(bad(format!("unknown record tag {t}"))),
    };
    if !c.0.is_empty() {
        return Err(bad("trailing bytes in a record"));
    }
    Ok(r)
}

/// Turns compressed chunks into records, holding little whatever the input.
pub struct Decoder {
    z: flate2::write::DeflateDecoder<Vec<u8>>,
    /// Inflated bytes not yet parsed (less than one record, plus one step).
    pending: Vec<u8>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    pub fn new() -> Self {
        Decoder {
            z: flate2::write::DeflateDecoder::new(Vec::new()),
            pending: Vec::new(),
        }
    }

    /// Feed compressed bytes; `out` gets every record completed by them. Stops at the first
    /// bad record.
    pub fn feed(&mut self, chunk: &[u8], out: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        for step in chunk.chunks(DECODE_STEP) {
            self.z.write_all(step).map_err(bad)?;
            self.z.flush().map_err(bad)?;
            self.pending.append(self.z.get_mut());
            self.parse(out)?;
        }
        Ok(())
    }

    fn parse(&mut self, out: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        let mut at = 0;
        loop {
            let mut c = Cursor(&self.pending[at..]);
            let len = match c.varint() {
                Ok(n) => n,
                Err(_) if self.pending.len() - at < 10 => break,
                Err(e) => return Err(e),
            };
            if len as usize > MAX_RECORD || len == 0 {
                return Err(bad(format!("a record of {len} bytes")));
            }
            let head = self.pending.len() - at - c.0.len();
            if c.0.len() < len as usize {
                break;
            }
            let start = at + head;
            out(record(&self.pending[start..start + len as usize])?)?;
            at = start + len as usize;
        }
        self.pending.drain(..at);
        Ok(())
    }

    /// The stream ended: anything left over is a cut answer.
    pub fn finish(mut self) -> Result<()> {
        let _ = self.z.try_finish();
        if !self.pending.is_empty() || !self.z.get_ref().is_empty() {
            return Err(bad("the answer ended mid-record"));
        }
        Ok(())
    }
}

/// Puts decoded records back into [`TreeListing`]s, checking that the answer is one the walk
/// could give: listings only for directories it named, sorted unique names, no more entries
/// than asked for, an end record.
pub struct Assembler {
    /// Directories numbered and not yet listed, in order.
    queue: VecDeque<RemotePath>,
    /// The listing being received: its directory, entries expected, entries so far.
    current: Option<(RemotePath, usize, Vec<DirEntry>)>,
    first: bool,
    /// Entries still allowed after the first listing.
    budget: usize,
    ended: bool,
    /// Listings complete, for the caller to take.
    pub ready: VecDeque<TreeListing>,
}

impl Assembler {
    pub fn new(path: &RemotePath, max_entries: usize) -> Self {
        Assembler {
            queue: VecDeque::from([path.clone()]),
            current: None,
            first: true,
            budget: max_entries.min(MAX_TREE_ENTRIES),
            ended: false,
            ready: VecDeque::new(),
        }
    }

    pub fn ended(&self) -> bool {
        self.ended
    }

    pub fn on(&mut self, r: Record) -> Result<()> {
        if self.ended {
            return Err(bad("records after the end"));
        }
        match r {
            Record::Listing(n) => {
                let n = usize::try_from(n).map_err(|_| bad("listing size"))?;
                if self.current.is_some() {
                    return Err(bad("a listing inside a listing"));
                }
                if n > MAX_DIR_ENTRIES || (!self.first && n > self.budget) {
                    return Err(bad(format!(
                        "a listing of {n} entries, more than asked for"
                    )));
                }
                if !self.first {
                    self.budget -= n;
                }
                self.first = false;
                let dir = self
                    .queue
                    .pop_front()
                    .ok_or_else(|| bad("a listing too many"))?;
                self.current = Some((dir, n, Vec::new()));
                self.complete();
            }
            Record::Entry(e) => {
                let (dir, _, entries) = self
                    .current
                    .as_mut()
                    .ok_or_else(|| bad("an entry outside a listing"))?;
                if entries
                    .last()
                    .is_some_and(|l: &DirEntry| l.name.0 >= e.name.0)
                {
                    return Err(bad("names unsorted or repeated"));
                }
                if e.attr.kind == FileKind::Dir {
                    self.queue.push_back(dir.join(&e.name.0)?);
                }
                entries.push(e);
                self.complete();
            }
            Record::Skipped => {
                if self.current.is_some() {
                    return Err(bad("a skip inside a listing"));
                }
                self.first = false;
                let path = self
                    .queue
                    .pop_front()
                    .ok_or_else(|| bad("a skip too many"))?;
                self.ready.push_back(TreeListing {
                    path,
                    entries: None,
                });
            }
            Record::End(err) => {
                if self.current.is_some() {
                    return Err(bad("the end inside a listing"));
                }
                if let Some(e) = err {
                    return Err(e);
                }
                self.ended = true;
                let rest = std::mem::take(&mut self.queue);
                self.ready.extend(rest.into_iter().map(|path| TreeListing {
                    path,
                    entries: None,
                }));
            }
        }
        Ok(())
    }

    fn complete(&mut self) {
        if self.current.as_ref().is_some_and(|(_, n, e)| e.len() == *n) {
            let (path, _, entries) = self.current.take().expect("checked");
            self.ready.push_back(TreeListing {
                path,
                entries: Some(entries),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: FileKind, ino: u64) -> Attr {
        let mut a = Attr {
            kind,
            size: 1234,
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            atime_ns: -5,
            mtime_ns: 1_700_000_000_123_456_789,
            ctime_ns: 1_700_000_000_000_000_000,
            dev: libc::makedev(8, 1),
            ino,
            born_ns: 0,
            nlink: 1,
            rdev: 0,
            symlink_target: None,
            version: Version(String::new()),
            has_xattrs: None,
        };
        a.version = derived_version(&a);
        a
    }

    /// The attributes of `entries` as a listing encoded with `trailer` and decoded again.
    fn round_trip(entries: &[DirEntry], trailer: Trailer) -> Vec<Attr> {
        let mut e = Encoder::with(trailer);
        e.listing(entries);
        e.end(None);
        decode_all(&e.finish())
            .unwrap()
            .into_iter()
            .filter_map(|r| match r {
                Record::Entry(e) => Some(e.attr),
                _ => None,
            })
            .collect()
    }

    fn decode_all(bytes: &[u8]) -> Result<Vec<Record>> {
        let mut d = Decoder::new();
        let mut out = Vec::new();
        // Byte by byte: records cut anywhere still come out whole.
        for b in bytes.chunks(1) {
            d.feed(b, &mut |r| {
                out.push(r);
                Ok(())
            })?;
        }
        d.finish()?;
        Ok(out)
    }

    #[test]
    fn records_round_trip_through_compression() {
        let mut link = attr(FileKind::Symlink, 9);
        link.symlink_target = Some(WireBytes(b"../x".to_vec()));
        let mut odd = attr(FileKind::File, 10);
        odd.version = Version("memory-7".into());
        let entries = vec![
            DirEntry {
                name: WireBytes(b"new\nline \xff".to_vec()),
                attr: attr(FileKind::Dir, 8),
            },
            DirEntry {
                name: WireBytes(b"l".to_vec()),
                attr: link,
            },
            DirEntry {
                name: WireBytes(b"o".to_vec()),
                attr: odd,
            },
        ];
        let mut e = Encoder::new();
        e.listing(&entries);
        e.skipped();
        let mut bytes = e.take();
        e.end(Some(&ErrorBody::from_error(&RemoteError::Access(
            "x".into(),
        ))));
        bytes.extend(e.finish());
        let got = decode_all(&bytes).unwrap();
        assert_eq!(got[0], Record::Listing(3));
        for (i, want) in entries.into_iter().enumerate() {
            assert_eq!(got[1 + i], Record::Entry(want));
        }
        assert_eq!(got[4], Record::Skipped);
        assert!(matches!(got[5], Record::End(Some(RemoteError::Access(_)))));
    }

    #[test]
    fn impossible_names_and_oversized_records_are_refused() {
        for name in [&b"a/b"[..], b"..", b"", b"a\0b"] {
            let mut e = Encoder::new();
            e.listing(&[DirEntry {
                name: WireBytes(name.to_vec()),
                attr: attr(FileKind::File, 1),
            }]);
            let err = decode_all(&e.finish()).unwrap_err();
            assert!(err.to_string().contains("impossible name"), "{err}");
        }
        let mut raw = Vec::new();
        put_varint(&mut raw, (MAX_RECORD + 1) as u64);
        raw.extend(vec![b'S'; 32]);
        let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(&raw).unwrap();
        assert!(decode_all(&z.finish().unwrap()).is_err());
    }

    #[test]
    fn a_cut_answer_is_an_error() {
        let mut e = Encoder::new();
        e.listing(&[DirEntry {
            name: WireBytes(b"a".to_vec()),
            attr: attr(FileKind::File, 1),
        }]);
        let bytes = e.finish();
        assert!(decode_all(&bytes[..bytes.len() / 2]).is_err());
    }

    #[test]
    fn a_deflate_bomb_inflates_in_bounded_steps() {
        // 256 MiB of one byte value compresses to ~256 KiB; fed whole, the decoder must not
        // hold it: it fails on the first (absurd) record length instead.
        let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        let block = vec![0xffu8; 1 << 20];
        for _ in 0..256 {
            z.write_all(&block).unwrap();
        }
        let bomb = z.finish().unwrap();
        let mut d = Decoder::new();
        let err = d.feed(&bomb, &mut |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("varint") || err.to_string().contains("record"));
        assert!(d.pending.capacity() <= 8 << 20);
    }

    #[test]
    fn the_has_xattrs_byte_is_sent_only_when_asked_and_optional_when_read() {
        let entries: Vec<DirEntry> = [Some(false), Some(true), None]
            .into_iter()
            .enumerate()
            .map(|(i, x)| DirEntry {
                name: WireBytes(vec![b'a' + i as u8]),
                attr: Attr {
                    has_xattrs: x,
                    ..attr(FileKind::File, i as u64)
                },
            })
            .collect();
        let decoded = |trailer: Trailer| -> Vec<Option<bool>> {
            round_trip(&entries, trailer)
                .into_iter()
                .map(|a| a.has_xattrs)
                .collect()
        };
        assert_eq!(
            decoded(Trailer {
                xattrs: true,
                born: false
            }),
            [Some(false), Some(true), None]
        );
        // An older agent's records (no byte): unknown, so the mount asks.
        assert_eq!(decoded(Trailer::default()), [None, None, None]);
        let mut r = Vec::new();
        let xattrs = Trailer {
            xattrs: true,
            born: false,
        };
        put_entry(&mut r, b"a", &entries[0].attr, xattrs);
        *r.last_mut().unwrap() = 7;
        assert!(record(&r).is_err());
        // After the byte, a birth time and nothing more.
        *r.last_mut().unwrap() = 0;
        r.extend([0, 0]);
        assert!(record(&r).is_err());
        r.pop();
        r.push(0x80);
        assert!(record(&r).is_err(), "a cut varint");
    }

    #[test]
    fn birth_times_travel_when_asked_and_make_part_of_the_version() {
        let born = |ns: i64| Attr {
            born_ns: ns,
            ..attr(FileKind::File, 9)
        };
        let entries: Vec<DirEntry> = [0, 1_700_000_000_123_456_789, -5]
            .into_iter()
            .enumerate()
            .map(|(i, ns)| {
                let mut a = born(ns);
                a.version = derived_version(&a);
                DirEntry {
                    name: WireBytes(vec![b'a' + i as u8]),
                    attr: a,
                }
            })
            .collect();
        assert_ne!(entries[0].attr.version, entries[1].attr.version);
        assert_eq!(
            entries[0].attr.version,
            derived_version(&attr(FileKind::File, 9))
        );
        let decoded = |trailer: Trailer| round_trip(&entries, trailer);
        let both = Trailer {
            xattrs: true,
            born: true,
        };
        let got = decoded(both);
        assert_eq!(
            got,
            entries.iter().map(|e| e.attr.clone()).collect::<Vec<_>>()
        );
        // Not asked: no birth time, and the version (spelled out, not derived) still exact.
        let got = decoded(Trailer::default());
        assert!(got.iter().all(|a| a.born_ns == 0));
        assert_eq!(got[1].version, entries[1].attr.version);
    }

    #[test]
    fn zigzag_round_trips_extremes() {
        for v in [0, 1, -1, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }
}
