//! File modes: what a new file gets under the user's umask.
use std::path::Path;

use anyhow::Result;

/// The process's umask (Linux reports it in /proc/self/status; elsewhere the common 022).
pub fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Umask:").map(|v| v.trim().to_string())))
        .and_then(|v| u32::from_str_radix(&v, 8).ok())
        .unwrap_or(0o022)
}

/// Files copied from a read-only source (a hub cache) would stay read-only: every file of `dir`
/// gets what a new file gets, read-write under the user's umask.
pub(crate) fn new_file_modes(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = 0o666 & !umask();
    for entry in std::fs::read_dir(dir)? {
        std::fs::set_permissions(entry?.path(), std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}
