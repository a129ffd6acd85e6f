//! Landlock, as defence in depth: `sbxfs agent` restricts itself at start so that even a bug in
//! its path handling cannot read or write outside the workspace. Allowed: everything beneath
//! the workspace root; reading `/proc/self` (descriptor paths) and the shared-library
//! directories (a library loaded lazily). Nothing else is readable or writable. Best effort: a
//! kernel without Landlock logs one line and the agent runs on, confined by `openat2` alone.
//!
//! Landlock restricts the calling thread and the threads it starts later, so this runs before
//! the agent starts any thread.

use std::path::Path;

use landlock::{
    path_beneath_rules, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    ABI,
};

/// The newest Landlock ABI this agent knows; older kernels enforce what they can.
const ABI_WANTED: ABI = ABI::V7;

/// Read-only places the agent may still need once confined.
const READ_ONLY: [&str; 5] = ["/proc/self", "/lib", "/lib64", "/usr/lib", "/usr/lib64"];

/// How far Landlock confines the agent, as `/v1/info` and the start-up log say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confinement {
    /// Every access right this agent asks for is enforced.
    Full,
    /// The kernel's Landlock is older: some rights (e.g. truncate, ioctl) are not enforced.
    Partial,
    /// The kernel has no Landlock.
    Unavailable,
    /// Turned off with `--no-landlock`.
    Disabled,
}

impl Confinement {
    pub fn as_str(self) -> &'static str {
        match self {
            Confinement::Full => "enforced",
            Confinement::Partial => "partially enforced",
            Confinement::Unavailable => "unavailable",
            Confinement::Disabled => "disabled",
        }
    }
}

/// Restrict the calling thread (and every thread it starts afterwards) to `root` plus the
/// read-only places listed above. An error means Landlock exists but the rules could not be
/// applied.
pub fn confine(root: &Path) -> Result<Confinement, landlock::RulesetError> {
    confine_with_socket(root, None)
}

/// [`confine`], also letting the agent make and remove its Unix socket in `socket_dir` (nothing
/// else there: not even reading).
pub fn confine_with_socket(
    root: &Path,
    socket_dir: Option<&Path>,
) -> Result<Confinement, landlock::RulesetError> {
    let all = AccessFs::from_all(ABI_WANTED);
    let read = AccessFs::from_read(ABI_WANTED);
    let existing = READ_ONLY.iter().filter(|p| Path::new(p).exists());
    let status = Ruleset::default()
        .handle_access(all)?
        .create()?
        .add_rules(path_beneath_rules([root], all))?
        .add_rules(path_beneath_rules(existing, read))?
        .add_rules(path_beneath_rules(
            socket_dir,
            AccessFs::MakeSock | AccessFs::RemoveFile,
        ))?
        .restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Confinement::Full,
        RulesetStatus::PartiallyEnforced => Confinement::Partial,
        RulesetStatus::NotEnforced => Confinement::Unavailable,
    })
}
