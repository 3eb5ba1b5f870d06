//! The run directory: where every stage reads its inputs and writes its outputs.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Write a file atomically: a temporary sibling, fsync, then rename over the target.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let name = path.file_name().context("atomic_write needs a file name")?.to_string_lossy();
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

/// The layout of a run directory (spec §4).
#[derive(Debug, Clone)]
pub struct RunDir {
    pub root: PathBuf,
}

impl RunDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    pub fn config(&self) -> PathBuf {
        self.root.join("config.toml")
    }
    pub fn agents(&self) -> PathBuf {
        self.root.join("agents")
    }
    pub fn agent(&self, i: usize) -> PathBuf {
        self.agents().join(format!("agent_{i}"))
    }
    pub fn eval(&self) -> PathBuf {
        self.root.join("eval")
    }
    pub fn metrics(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }

    /// Write the resolved config of the command being run.
    pub fn write_config(&self, toml_text: &str) -> Result<()> {
        atomic_write(&self.config(), toml_text.as_bytes())
    }

    /// Append one JSON object to metrics.jsonl (one line per logged step).
    pub fn log_metrics(&self, record: &serde_json::Value) -> Result<()> {
        use std::io::Write;
        std::fs::create_dir_all(&self.root)?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.metrics())
            .with_context(|| format!("opening {}", self.metrics().display()))?;
        writeln!(f, "{}", serde_json::to_string(record)?)?;
        Ok(())
    }
}
