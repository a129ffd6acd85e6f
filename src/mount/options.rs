//! `-o` mount options, in the comma-separated form `mount(8)`, fstab and `mount.fuse3` use:
//! `sbxfs mount URL MNT -o allow_other,ro,cache_size=1G,staging_dir=/var/tmp/sbx`.
//!
//! Every long flag of `sbxfs mount` is also an option key (`attr_ttl_ms`, `cache_size`,
//! `staging_dir`, `token_file`; `-` and `_` alike), next to the FUSE ones (`allow_other`,
//! `default_permissions`, `ro`/`rw`, `exec`/`noexec`) and `idmap=user|none`. Options that
//! belong to `mount(8)` or systemd (`_netdev`, `noauto`, `nofail`, `x-systemd.*`, `comment=…`,
//! …) reach the program in an fstab line and are accepted and ignored; anything else is an
//! error, so a typo never mounts with a setting silently missing. Later options win over
//! earlier ones, and `-o` over the flag of the same name.

use std::path::PathBuf;

/// Who files appear to be owned by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IdMap {
    /// The sandbox's user and group show as the mounting user's (for sandboxes you trust: it
    /// switches off ownership checks such as git's "dubious ownership" guard).
    User,
    /// The sandbox's own uids and gids, unmapped.
    #[default]
    None,
}

impl IdMap {
    pub fn as_str(self) -> &'static str {
        match self {
            IdMap::User => "user",
            IdMap::None => "none",
        }
    }
}

/// What a set of `-o` options asks for; `None`/`false` where it says nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountOptions {
    pub allow_other: bool,
    pub default_permissions: bool,
    pub read_only: Option<bool>,
    pub no_exec: Option<bool>,
    pub idmap: Option<IdMap>,
    pub attr_ttl_ms: Option<u64>,
    /// Deadline of one remote call (`timeout_ms=`); the others scale with it.
    pub timeout_ms: Option<u64>,
    pub cache_size: Option<u64>,
    /// Bytes of file data kept on disk for remounts (`disk_cache_size=`; 0: none).
    pub disk_cache_size: Option<u64>,
    /// Entries a directory's first look fetches with its subtree (`tree_max=N`; 0: off).
    pub tree_max: Option<usize>,
    /// Seconds within which every known file is re-checked while the change feed is connected
    /// (`recheck_s=N`; 0: off).
    pub recheck_s: Option<u64>,
    pub staging_dir: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    /// https: extra trusted CAs (`ca_file=`), extra request headers (`header_file=`).
    pub ca_file: Option<PathBuf>,
    pub header_file: Option<PathBuf>,
    /// ssh://: the ssh command to run instead of `ssh` (`ssh_command=`, as sshfs has it).
    pub ssh_command: Option<String>,
    /// Mount over a directory that is not empty.
    pub nonempty: bool,
    /// `close` waits until the sandbox has the file (`sync_close`).
    pub sync_close: bool,
    /// An agent the mount starts (`shell:`, `exec:`) keeps set-ID bits (`allow_setid`).
    pub allow_setid: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("unknown mount option `{0}`")]
    Unknown(String),
    #[error("mount option `{0}` needs a value (`{0}=…`)")]
    MissingValue(String),
    #[error("mount option `{0}` takes no value")]
    UnexpectedValue(String),
    #[error("mount option `{key}`: {reason}")]
    BadValue { key: String, reason: String },
    #[error("mount options `{0}`: unbalanced quote")]
    Quote(String),
}

/// For `mount(8)` and systemd, not for the filesystem: accepted and ignored (`mount.fuse3`
/// strips most of them itself, and adds `dev,suid` when the line says neither). `dev`/`suid` are
/// ignored because the mount is always `nodev,nosuid`; `atime` because it is always `noatime`.
const IGNORED: &[&str] = &[
    "_netdev",
    "auto",
    "noauto",
    "nofail",
    "user",
    "nouser",
    "users",
    "owner",
    "noowner",
    "group",
    "nogroup",
    "defaults",
    "async",
    "silent",
    "loud",
    "rw",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "diratime",
    "nodiratime",
];

impl MountOptions {
    /// Parse one `-o` argument into `self` (several `-o` accumulate; later values win).
    pub fn parse_into(&mut self, arg: &str) -> Result<(), OptionError> {
        for item in split(arg)? {
            if item.is_empty() {
                continue;
            }
            let (raw_key, value) = match item.split_once('=') {
                Some((k, v)) => (k, Some(unquote(v))),
                None => (item.as_str(), None),
            };
            if raw_key.starts_with("x-systemd.") || raw_key == "comment" {
                continue;
            }
            let key = raw_key.replace('-', "_");
            let flag = |set: &mut bool| -> Result<(), OptionError> {
                match value {
                    Some(_) => Err(OptionError::UnexpectedValue(raw_key.into())),
                    None => {
                        *set = true;
                        Ok(())
                    }
                }
            };
            let needed = || {
                value
                    .clone()
                    .ok_or(OptionError::MissingValue(raw_key.into()))
            };
            let bad = |reason: String| OptionError::BadValue {
                key: raw_key.into(),
                reason,
            };
            match key.as_str() {
                "allow_other" => flag(&mut self.allow_other)?,
                "default_permissions" => flag(&mut self.default_permissions)?,
                "nonempty" => flag(&mut self.nonempty)?,
                "sync_close" => flag(&mut self.sync_close)?,
                "allow_setid" => flag(&mut self.allow_setid)?,
                "ro" | "rw" => {
                    flag(&mut false)?;
                    self.read_only = Some(key == "ro");
                }
                "exec" | "noexec" => {
                    flag(&mut false)?;
                    self.no_exec = Some(key == "noexec");
                }
                "idmap" => {
                    self.idmap = Some(match needed()?.as_str() {
                        "user" => IdMap::User,
                        "none" => IdMap::None,
                        other => return Err(bad(format!("`{other}` is not `user` or `none`"))),
                    })
                }
                "attr_ttl_ms" => {
                    self.attr_ttl_ms = Some(
                        needed()?
                            .parse()
                            .map_err(|_| bad("not a number of milliseconds".into()))?,
                    )
                }
                "timeout_ms" => {
                    self.timeout_ms =
                        Some(
                            needed()?.parse().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                                bad("not a positive number of milliseconds".into())
                            })?,
                        )
                }
                "tree_max" => {
                    self.tree_max = Some(
                        needed()?
                            .parse()
                            .map_err(|_| bad("not a number of entries (0 turns it off)".into()))?,
                    )
                }
                "recheck_s" => {
                    self.recheck_s = Some(
                        needed()?
                            .parse()
                            .map_err(|_| bad("not a number of seconds (0 turns it off)".into()))?,
                    )
                }
                "cache_size" => self.cache_size = Some(parse_size(&needed()?).map_err(bad)?),
                "disk_cache_size" => {
                    self.disk_cache_size = Some(parse_size(&needed()?).map_err(bad)?)
                }
                "staging_dir" => self.staging_dir = Some(non_empty_path(needed()?).map_err(bad)?),
                "token_file" => self.token_file = Some(non_empty_path(needed()?).map_err(bad)?),
                "ca_file" => self.ca_file = Some(non_empty_path(needed()?).map_err(bad)?),
                "header_file" => self.header_file = Some(non_empty_path(needed()?).map_err(bad)?),
                "ssh_command" => {
                    let cmd = needed()?;
                    if cmd.trim().is_empty() {
                        return Err(bad("an empty command".into()));
                    }
                    self.ssh_command = Some(cmd)
                }
                _ if IGNORED.contains(&raw_key) => {}
                _ => return Err(OptionError::Unknown(item.clone())),
            }
        }
        Ok(())
    }
}

fn non_empty_path(v: String) -> Result<PathBuf, String> {
    if v.is_empty() {
        Err("empty path".into())
    } else {
        Ok(PathBuf::from(v))
    }
}

/// Split on commas outside double quotes (`staging_dir="/a,b"`), as `mount(8)` does.
fn split(arg: &str) -> Result<Vec<String>, OptionError> {
    let mut items = vec![String::new()];
    let mut quoted = false;
    for c in arg.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                items.last_mut().expect("one item").push(c);
            }
            ',' if !quoted => items.push(String::new()),
            c => items.last_mut().expect("one item").push(c),
        }
    }
    if quoted {
        return Err(OptionError::Quote(arg.into()));
    }
    Ok(items)
}

fn unquote(v: &str) -> String {
    v.replace('"', "")
}

/// A size in bytes: `524288`, `512K`, `512M`, `1G`, `1T` (binary multiples; `KiB`/`MB`-style
/// suffixes and lower case accepted).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (like 524288, 512M, 1G)"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (K, M, G, T)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Whether `/etc/fuse.conf` (its text) lets users other than root mount with `allow_other`.
pub fn fuse_conf_allows_other(conf: &str) -> bool {
    conf.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .any(|l| l == "user_allow_other")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<MountOptions, OptionError> {
        let mut o = MountOptions::default();
        o.parse_into(s).map(|()| o)
    }

    #[test]
    fn every_option_is_read_into_its_field() {
        let o = parse(
            "allow_other,default_permissions,nonempty,ro,idmap=none,attr_ttl_ms=250,cache_size=512M,disk_cache_size=0,\
             staging_dir=/var/tmp/s,token_file=/etc/sbxfs/token,noexec,timeout_ms=1500,sync_close,allow_setid,tree_max=0,\
             recheck_s=5,ca_file=/c.pem,header_file=/h,ssh_command=\"ssh -p 2222\"",
        )
        .unwrap();
        assert_eq!(
            o,
            MountOptions {
                allow_other: true,
                default_permissions: true,
                read_only: Some(true),
                no_exec: Some(true),
                idmap: Some(IdMap::None),
                attr_ttl_ms: Some(250),
                timeout_ms: Some(1500),
                cache_size: Some(512 << 20),
                disk_cache_size: Some(0),
                tree_max: Some(0),
                recheck_s: Some(5),
                staging_dir: Some("/var/tmp/s".into()),
                token_file: Some("/etc/sbxfs/token".into()),
                ca_file: Some("/c.pem".into()),
                header_file: Some("/h".into()),
                ssh_command: Some("ssh -p 2222".into()),
                nonempty: true,
                sync_close: true,
                allow_setid: true,
            }
        );
    }

    #[test]
    fn flag_spellings_with_dashes_are_keys_too() {
        let o = parse("attr-ttl-ms=5,cache-size=1G,staging-dir=/s,token-file=/t").unwrap();
        assert_eq!(o.attr_ttl_ms, Some(5));
        assert_eq!(o.cache_size, Some(1 << 30));
        assert_eq!(o.staging_dir, Some("/s".into()));
        assert_eq!(o.token_file, Some("/t".into()));
    }

    #[test]
    fn options_for_mount_and_systemd_are_ignored() {
        let o = parse(
            "_netdev,noauto,auto,nofail,user,nouser,users,owner,group,defaults,async,relatime,\
             x-systemd.automount,x-systemd.requires=network-online.target,\
             x-systemd.mount-timeout=30,comment=x-gvfs-show,rw,dev,suid,exec,nodev,nosuid,atime,noatime",
        )
        .unwrap();
        assert_eq!(
            o,
            MountOptions {
                read_only: Some(false),
                no_exec: Some(false),
                ..Default::default()
            }
        );
    }

    #[test]
    fn later_options_win_and_several_arguments_accumulate() {
        let mut o = MountOptions::default();
        o.parse_into("ro,cache_size=1M").unwrap();
        o.parse_into("rw,cache_size=2M").unwrap();
        assert_eq!((o.read_only, o.cache_size), (Some(false), Some(2 << 20)));
    }

    #[test]
    fn quoted_values_may_hold_commas_and_empty_items_are_skipped() {
        let o = parse(r#"staging_dir="/tmp/a,b",,ro,"#).unwrap();
        assert_eq!(o.staging_dir, Some("/tmp/a,b".into()));
        assert_eq!(o.read_only, Some(true));
        assert_eq!(
            parse(r#"staging_dir="/tmp"#),
            Err(OptionError::Quote(r#"staging_dir="/tmp"#.into()))
        );
    }

    #[test]
    fn mistakes_are_errors_that_name_the_option() {
        assert_eq!(
            parse("ro,allow_others"),
            Err(OptionError::Unknown("allow_others".into()))
        );
        assert_eq!(
            parse("cache_size"),
            Err(OptionError::MissingValue("cache_size".into()))
        );
        assert_eq!(
            parse("ro=1"),
            Err(OptionError::UnexpectedValue("ro".into()))
        );
        assert!(matches!(
            parse("idmap=root"),
            Err(OptionError::BadValue { .. })
        ));
        assert!(matches!(
            parse("attr_ttl_ms=1s"),
            Err(OptionError::BadValue { .. })
        ));
        assert!(matches!(
            parse("staging_dir="),
            Err(OptionError::BadValue { .. })
        ));
        assert_eq!(
            parse("bogus=1").unwrap_err().to_string(),
            "unknown mount option `bogus=1`"
        );
    }

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 * 1024));
        assert_eq!(parse_size("512M"), Ok(512 * 1024 * 1024));
        assert_eq!(parse_size("512MiB"), Ok(512 * 1024 * 1024));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn fuse_conf_needs_an_uncommented_user_allow_other() {
        assert!(fuse_conf_allows_other("# comment\nuser_allow_other\n"));
        assert!(fuse_conf_allows_other("  user_allow_other  # for sbxfs\n"));
        assert!(!fuse_conf_allows_other(
            "#user_allow_other\nmount_max = 1000\n"
        ));
        assert!(!fuse_conf_allows_other(""));
    }
}
