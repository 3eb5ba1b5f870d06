//! One writer per run directory: an exclusive advisory lock (`flock`) on `<run_dir>/.pbrl.lock`,
//! taken by every command that writes there and released when the process ends, however it
//! ends. A second command gets an error naming the holder's pid and command.
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use super::RunDir;

/// Held for the lifetime of a command; dropping it (or the process ending) releases the lock.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
    pub path: PathBuf,
}

impl RunLock {
    pub fn acquire(run_dir: &RunDir, command: &str) -> Result<Self> {
        let root = &run_dir.root;
        std::fs::create_dir_all(root).with_context(|| format!("creating the run directory {}", root.display()))?;
        let path = run_dir.lock();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW) // never through a link: its target would be rewritten
            .open(&path)
            .with_context(|| format!("opening {} (a symbolic link there is refused)", path.display()))?;
        // SAFETY: flock on a file descriptor we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                // The holder writes "pbrl COMMAND (pid N)" once it has the lock; an older text
                // (a finished command's) or none means some other process holds it.
                let pid = holder.rsplit_once("(pid ").and_then(|(_, p)| p.trim_end_matches(')').trim().parse().ok());
                let who = match pid {
                    Some(pid) if super::atomic::pid_alive(pid) => format!("`{}`", holder.trim()),
                    _ => "another process".to_string(),
                };
                bail!(
                    "the run directory {} is in use by {who}; wait for it to finish or use another run_dir",
                    root.display()
                );
            }
            return Err(err).with_context(|| format!("locking {}", path.display()));
        }
        file.set_len(0).and_then(|_| file.rewind()).with_context(|| format!("writing {}", path.display()))?;
        write!(file, "pbrl {command} (pid {})", std::process::id())
            .with_context(|| format!("writing {}", path.display()))?;
        file.flush()?;
        Ok(Self { _file: file, path })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid() {
        let d = tempfile::tempdir().unwrap();
        let first = RunLock::acquire(&RunDir::new(d.path()), "collect").unwrap();
        let e = format!("{:#}", RunLock::acquire(&RunDir::new(d.path()), "eval").unwrap_err());
        assert!(e.contains("in use by `pbrl collect (pid ") && e.contains(&std::process::id().to_string()), "{e}");
        drop(first);
        RunLock::acquire(&RunDir::new(d.path()), "eval").unwrap();
    }
}
