//! The `stat -c` lines the exec-only scripts print, and versions made from them.
//!
//! Versions are the agent's (`MAJOR:MINOR-INO-SIZE-MTIME_NS`, hex): they change whenever the
//! content may have, and name the device. A commit's base check runs inside the script, so
//! a version is turned back into the `stat -c "$VF"` fields it was made from, to be compared
//! there as text.

use crate::remote::{Attr, FileKind, RemoteError, Version};

use super::program::malformed;

/// How precise the sandbox's `stat` is: GNU coreutils prints nanoseconds (`%.9Y`); busybox
/// only seconds (then a same-second rewrite of the same size keeps its version).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Nanos,
    Seconds,
}

impl Precision {
    /// `stat -c` format of a full attribute line.
    pub fn attr_format(self) -> &'static str {
        match self {
            Precision::Nanos => "%f %s %u %g %.9X %.9Y %.9Z %d %i %h %t %T",
            Precision::Seconds => "%f %s %u %g %X %Y %Z %d %i %h %t %T",
        }
    }
    /// `stat -c` format of the fields a version is made of.
    pub fn version_format(self) -> &'static str {
        match self {
            Precision::Nanos => "%d %i %s %.9Y",
            Precision::Seconds => "%d %i %s %Y",
        }
    }
}

fn num<T: std::str::FromStr>(s: &str) -> Result<T, RemoteError> {
    s.parse()
        .map_err(|_| malformed("a stat field is not a number"))
}

/// `SECONDS[.NANOS]` as nanoseconds.
fn time_ns(s: &str) -> Result<i64, RemoteError> {
    let (secs, frac) = s.split_once('.').unwrap_or((s, "0"));
    let secs: i64 = num(secs)?;
    if frac.len() > 9 || frac.bytes().any(|b| !b.is_ascii_digit()) {
        return Err(malformed("a stat time"));
    }
    let nanos: i64 = num::<i64>(frac)? * 10i64.pow(9 - frac.len() as u32);
    let sign = if s.starts_with('-') { -1 } else { 1 };
    // A time past what nanoseconds in 64 bits hold (year 2262) is refused, not wrapped.
    secs.checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(sign * nanos))
        .ok_or_else(|| malformed("a stat time out of range"))
}

fn version(dev: u64, ino: u64, size: u64, mtime_ns: i64) -> Version {
    Version(format!(
        "{:x}:{:x}-{:x}-{:x}-{:x}",
        libc::major(dev),
        libc::minor(dev),
        ino,
        size,
        mtime_ns,
    ))
}

/// An attribute line (`Precision::attr_format`), with a symlink's target if known.
pub fn parse_attr(line: &str, symlink_target: Option<Vec<u8>>) -> Result<Attr, RemoteError> {
    let f: Vec<&str> = line.split(' ').collect();
    if f.len() != 12 {
        return Err(malformed("a stat line without 12 fields"));
    }
    let raw = u32::from_str_radix(f[0], 16).map_err(|_| malformed("a stat mode"))?;
    let kind = match raw & libc::S_IFMT {
        libc::S_IFREG => FileKind::File,
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFBLK => FileKind::BlockDevice,
        _ => FileKind::Other,
    };
    let size = num(f[1])?;
    let mtime_ns = time_ns(f[5])?;
    let dev = num(f[7])?;
    let ino = num(f[8])?;
    let hex = |s: &str| u32::from_str_radix(s, 16).map_err(|_| malformed("a device number"));
    let rdev = match kind {
        FileKind::CharDevice | FileKind::BlockDevice => libc::makedev(hex(f[10])?, hex(f[11])?),
        _ => 0,
    };
    Ok(Attr {
        kind,
        size,
        mode: raw & 0o7777,
        uid: num(f[2])?,
        gid: num(f[3])?,
        atime_ns: time_ns(f[4])?,
        mtime_ns,
        ctime_ns: time_ns(f[6])?,
        dev,
        ino,
        born_ns: 0,
        nlink: num(f[9])?,
        rdev,
        symlink_target: symlink_target.map(crate::remote::WireBytes),
        version: version(dev, ino, size, mtime_ns),
        has_xattrs: None,
    })
}

/// A version-fields line (`Precision::version_format`) as a version.
pub fn parse_version_fields(line: &str) -> Result<Version, RemoteError> {
    let f: Vec<&str> = line.split(' ').collect();
    if f.len() != 4 {
        return Err(malformed("a version line without 4 fields"));
    }
    Ok(version(num(f[0])?, num(f[1])?, num(f[2])?, time_ns(f[3])?))
}

/// The `stat -c "$VF"` text a file at `v` prints; `None` for a version not made here (it
/// can never match).
pub fn version_fields(v: &Version, precision: Precision) -> Option<String> {
    let (dev, rest) = v.0.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    let mut parts = rest.split('-');
    let ino = u64::from_str_radix(parts.next()?, 16).ok()?;
    let size = u64::from_str_radix(parts.next()?, 16).ok()?;
    let mtime = u64::from_str_radix(parts.next()?, 16).ok()? as i64;
    if parts.next().is_some() {
        return None;
    }
    let dev = libc::makedev(
        u32::from_str_radix(major, 16).ok()?,
        u32::from_str_radix(minor, 16).ok()?,
    );
    let secs = mtime.div_euclid(1_000_000_000);
    let nanos = mtime.rem_euclid(1_000_000_000);
    let time = match precision {
        Precision::Nanos if mtime < 0 && nanos != 0 => return None,
        Precision::Nanos => format!("{secs}.{nanos:09}"),
        Precision::Seconds if nanos != 0 => return None,
        Precision::Seconds => secs.to_string(),
    };
    Some(format!("{dev} {ino} {size} {time}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_past_64_bits_of_nanoseconds_is_refused_not_a_panic() {
        for t in [
            "99999999999999999999.999999999",
            "-9223372036854775808.5",
            "9223372037.0",
        ] {
            assert!(time_ns(t).is_err(), "{t}");
        }
        assert_eq!(time_ns("-1.5").unwrap(), -1_500_000_000);
        assert_eq!(time_ns("9223372036.854775807").unwrap(), i64::MAX);
    }

    #[test]
    fn a_version_turns_back_into_its_fields() {
        let line = "2049 1234 17 1796105219.164717640";
        let v = parse_version_fields(line).unwrap();
        assert_eq!(version_fields(&v, Precision::Nanos).unwrap(), line);
        let a = parse_attr(
            "81a4 17 1000 1000 1.5 1796105219.164717640 3.000000001 2049 1234 1 0 0",
            None,
        )
        .unwrap();
        assert_eq!(a.version, v);
        assert_eq!(a.kind, FileKind::File);
        assert_eq!(a.mode, 0o644);
        assert_eq!(a.atime_ns, 1_500_000_000);
        assert!(version_fields(&Version("elsewhere".into()), Precision::Nanos).is_none());
    }

    #[test]
    fn malformed_lines_are_errors() {
        assert!(parse_attr("81a4 17", None).is_err());
        assert!(parse_attr("zz 17 1 1 1 1 1 1 1 1 0 0", None).is_err());
        assert!(parse_version_fields("1 2 3 x").is_err());
    }
}
