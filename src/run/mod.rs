//! The run directory: where every stage reads its inputs and writes its outputs (`layout`), and
//! the rules that keep it whole: atomic writes (`atomic`), one writer at a time (`lock`), a team saved
//! all-or-nothing (`team`), and resumes refused under a changed setup (`fingerprint`; an iterate
//! run's record of its rounds: `iterate_log`).
pub mod atomic;
pub mod checkpoint;
pub mod fingerprint;
pub mod iterate_log;
pub mod layout;
pub mod lock;
pub mod team;

use anyhow::{Context, Result};

pub use atomic::{atomic_create, atomic_write};
pub use layout::RunDir;
pub use lock::RunLock;

impl RunDir {
    /// Write the resolved config of the command being run.
    pub fn write_config(&self, toml_text: &str) -> Result<()> {
        atomic_write(&self.config(), toml_text.as_bytes())
    }

    /// Append one JSON object to metrics.jsonl (one line per logged step).
    pub fn log_metrics(&self, record: &serde_json::Value) -> Result<()> {
        use std::io::Write;
        let path = self.metrics();
        std::fs::create_dir_all(&self.root).with_context(|| format!("creating {}", self.root.display()))?;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW) // never appended through a link to another file
            .open(&path)
            .with_context(|| format!("opening {} (a symbolic link there is refused)", path.display()))?;
        writeln!(f, "{}", serde_json::to_string(record)?).with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }
}
