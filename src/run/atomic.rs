//! Files that are whole or absent: written to a temporary sibling (`.NAME.tmp-PID`), synced,
//! then renamed into place. A temporary file never outlives an error, and one left by a killed
//! process is swept at the next command's start ([`sweep_stale`]). Every error names the file.
use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The temporary sibling a write of `path` goes through.
pub fn temp_sibling(path: &Path, kind: &str) -> Result<PathBuf> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().with_context(|| format!("{}: needs a file name", path.display()))?.to_string_lossy();
    Ok(parent.join(format!(".{name}.{kind}-{}", std::process::id())))
}

fn write_temp(path: &Path, bytes: &[u8]) -> Result<PathBuf> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = temp_sibling(path, "tmp")?;
    let written = (|| -> std::io::Result<()> {
        // A new file, never one that exists (a link planted at the temporary name would make
        // File::create write through it).
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(tmp)
}

/// Write `path` atomically, replacing what was there.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = write_temp(path, bytes)?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("renaming into {}", path.display()));
    }
    Ok(())
}

/// Write `path` atomically only if it does not exist yet (a hard link fails on an existing
/// name), so two writers of the same new file cannot both succeed.
pub fn atomic_create(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = write_temp(path, bytes)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            bail!("{} was written by another command meanwhile; nothing was overwritten", path.display())
        }
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

/// Atomically swap two existing paths (Linux `renameat2` with `RENAME_EXCHANGE`).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    let ca = CString::new(a.as_os_str().as_bytes())?;
    let cb = CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: two valid NUL-terminated paths relative to the working directory.
    let rc =
        unsafe { libc::renameat2(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), libc::RENAME_EXCHANGE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Fill a temporary sibling of `target` with `fill`, then swap it into place in one atomic
/// exchange (or rename, the first time); on failure nothing of it is left.
pub fn install_dir(target: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let tmp = temp_sibling(target, "tmp")?;
    let write = || -> Result<()> {
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        fill(&tmp)?;
        if target.exists() {
            exchange(&tmp, target).with_context(|| format!("replacing {}", target.display()))?;
            std::fs::remove_dir_all(&tmp)
                .with_context(|| format!("removing the previous contents in {}", tmp.display()))?;
        } else {
            std::fs::rename(&tmp, target).with_context(|| format!("renaming into {}", target.display()))?;
        }
        Ok(())
    };
    let result = write();
    if result.is_err() && tmp.exists() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Whether a process with this pid is alive (signal 0 probes without signalling).
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The pid in a temporary name `.NAME.tmp-PID` / `.NAME.old-PID`.
fn temp_pid(name: &str) -> Option<u32> {
    if !name.starts_with('.') {
        return None;
    }
    let (_, pid) = name.rsplit_once("-")?;
    let stem = &name[..name.len() - pid.len() - 1];
    (stem.ends_with(".tmp") || stem.ends_with(".old")).then(|| pid.parse().ok()).flatten()
}

/// Remove temporary files and directories of dead processes in `dir` and, one level down, in
/// its subdirectories (agents/, checkpoints/, eval/, preference_replay/, ...). Returns them.
pub fn sweep_stale(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    // Real subdirectories only: a symlinked one (rounds on another disk) is not swept, so no
    // file outside the run directory is ever removed.
    if let Ok(entries) = std::fs::read_dir(dir) {
        dirs.extend(entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
    }
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(pid) = temp_pid(&name) else { continue };
            if pid == std::process::id() || pid_alive(pid) {
                continue;
            }
            let p = e.path();
            // A link is removed itself, never followed.
            let real_dir = e.file_type().is_ok_and(|t| t.is_dir());
            let r = if real_dir { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            r.with_context(|| format!("removing the stale temporary {}", p.display()))?;
            removed.push(p);
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_and_their_pids() {
        assert_eq!(temp_pid(".iteration_0001.json.tmp-123"), Some(123));
        assert_eq!(temp_pid(".checkpoint-2.tmp-77"), Some(77));
        assert_eq!(temp_pid(".agents.old-9"), Some(9));
        assert_eq!(temp_pid("checkpoint-2"), None);
        assert_eq!(temp_pid(".hidden-3"), None);
    }

    #[test]
    fn create_refuses_an_existing_file_and_sweep_removes_dead_temps() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.json");
        atomic_create(&p, b"1").unwrap();
        let e = atomic_create(&p, b"2").unwrap_err();
        assert!(format!("{e:#}").contains("a.json"), "{e:#}");
        assert_eq!(std::fs::read(&p).unwrap(), b"1");
        // A pid that cannot be alive (above the kernel's pid_max).
        std::fs::create_dir_all(d.path().join("sub/.checkpoint-3.tmp-4194305")).unwrap();
        std::fs::write(d.path().join(".x.json.tmp-4194305"), b"").unwrap();
        std::fs::write(d.path().join(format!(".y.json.tmp-{}", std::process::id())), b"").unwrap();
        let removed = sweep_stale(d.path()).unwrap();
        assert_eq!(removed.len(), 2, "{removed:?}");
        assert!(d.path().join(format!(".y.json.tmp-{}", std::process::id())).exists(), "a live writer's file stays");
        let leftovers: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(leftovers.len(), 3, "{leftovers:?}"); // a.json, sub, our own temp
    }
}
