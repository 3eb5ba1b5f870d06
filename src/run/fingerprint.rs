//! What determines a training run's result, stored in every checkpoint so that `--resume`
//! under a changed setup is refused with the fields that differ: every config key that can
//! change the trained weights or the exported files (all of them but a short list of
//! bookkeeping keys below), the sha256 of each round file trained on, and the sha256 of each
//! actor's configured model source.
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::FingerprintConfig;

/// Keys that cannot change the trained weights or the exported files: where things go, what
/// is logged or evaluated, how often checkpoints are written, and the epochs (`num_train_epochs`,
/// `reward_num_train_epochs`: resuming with more epochs extends a run). With `keep_best` the evaluation keys choose the saved
/// agents, so they stay in ([`KEEP_BEST_KEYS`]).
const NOT_IN_FINGERPRINT: &[&str] = &[
    "run_dir",
    "preference_replay_dir",
    "keep_best_tolerance",
    "logging_steps",
    "eval_interval",
    "eval_num_samples",
    "eval_batch_size",
    "eval_samples_per_item",
    "checkpoint_interval",
    "checkpoint_total_limit",
    "reward_timeout_s",
    "num_train_epochs",
    "reward_num_train_epochs",
    "log_reward_distribution",
    "reward_range",
    "collect_batch_size",
    "reward_fresh_samples",
    "task.eval_file",
    "task.validation_file",
    // How patient the API comparator is: after an outage a resume may wait longer.
    "comparator_api_timeout",
    "comparator_api_max_attempts",
];

/// The keys of [`NOT_IN_FINGERPRINT`] that decide which agents `keep_best` saves.
const KEEP_BEST_KEYS: &[&str] = &[
    "keep_best_tolerance",
    "eval_interval",
    "eval_num_samples",
    "eval_batch_size",
    "eval_samples_per_item",
    "task.eval_file",
    "task.validation_file",
];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint(pub BTreeMap<String, String>);

fn flatten(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, String>) {
    match v {
        toml::Value::Table(t) => {
            for (k, x) in t {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, x, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

/// sha256 of a file, hex.
pub fn file_digest(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// sha256 of a model source's weights and config: a file, or a directory's `config.json` and
/// `*.safetensors`; a hub id (resolved in the cache) by its name.
pub fn source_digest(source: &str) -> Result<String> {
    let p = Path::new(source);
    if p.is_file() {
        return file_digest(p);
    }
    if p.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(p)
            .with_context(|| format!("reading {}", p.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|f| f.extension().is_some_and(|x| x == "safetensors") || f.ends_with("config.json"))
            .collect();
        files.sort();
        let mut h = Sha256::new();
        for f in files {
            h.update(f.file_name().unwrap_or_default().as_encoded_bytes());
            h.update(file_digest(&f)?.as_bytes());
        }
        return Ok(format!("{:x}", h.finalize()));
    }
    Ok(format!("hub:{source}"))
}

impl Fingerprint {
    /// The fingerprint of a training phase: the config, the round files, the actors' sources.
    pub fn of_training(cfg: &FingerprintConfig, rounds: &[(u32, &Path)], sources: &[String]) -> Result<Self> {
        let mut m = BTreeMap::new();
        flatten("", &cfg.table, &mut m);
        let kept = |k: &str| cfg.keep_best && KEEP_BEST_KEYS.contains(&k);
        m.retain(|k, _| !NOT_IN_FINGERPRINT.contains(&k.as_str()) || kept(k));
        if let Some(r) = &cfg.reference {
            m.insert("reference model".into(), source_digest(r)?);
        }
        for (n, path) in rounds {
            m.insert(format!("round {n:04}"), file_digest(path)?);
        }
        let mut digests: BTreeMap<&String, String> = BTreeMap::new();
        for (i, s) in sources.iter().enumerate() {
            if !digests.contains_key(s) {
                digests.insert(s, source_digest(s)?);
            }
            m.insert(format!("actor {i} model"), digests[s].clone());
        }
        Ok(Self(m))
    }

    /// `field: then → now` for every entry that differs (either side missing included).
    pub fn differences(&self, now: &Self) -> Vec<String> {
        let keys: std::collections::BTreeSet<&String> = self.0.keys().chain(now.0.keys()).collect();
        let show = |v: Option<&String>| {
            v.map_or("(absent)".to_string(), |s| {
                if s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit()) {
                    format!("{}…", &s[..12])
                } else {
                    s.clone()
                }
            })
        };
        // A key that no longer counts (a fingerprint written before it was left out) is no change.
        let never_counts = |k: &str| NOT_IN_FINGERPRINT.contains(&k) && !KEEP_BEST_KEYS.contains(&k);
        keys.into_iter()
            .filter(|k| !never_counts(k) && self.0.get(*k) != now.0.get(*k))
            .map(|k| format!("{k}: {} → {}", show(self.0.get(k)), show(now.0.get(k))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn changed_result_fields_are_listed_and_bookkeeping_is_not() {
        let a = Config::from_toml_str("agent_model = \"m\"", "t", &[]).unwrap();
        let mut b = a.clone();
        b.agent_learning_rate = 1e-5;
        b.dpo_beta = 0.2;
        b.eval_interval = 3;
        b.num_train_epochs = 7;
        let fa = Fingerprint::of_training(&a.fingerprinted().unwrap(), &[], &[]).unwrap();
        let fb = Fingerprint::of_training(&b.fingerprinted().unwrap(), &[], &[]).unwrap();
        let d = fa.differences(&fb);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(
            d[0].starts_with("agent_learning_rate: 5e-6 → 1e-5") || d[0].starts_with("agent_learning_rate"),
            "{d:?}"
        );
        assert!(d[1].starts_with("dpo_beta"), "{d:?}");
        assert!(fa.differences(&fa).is_empty());
        // With keep_best the evaluation schedule decides which agents are saved.
        let (mut c, mut d) = (a.clone(), b.clone());
        (c.keep_best, d.keep_best) = (true, true);
        let fc = Fingerprint::of_training(&c.fingerprinted().unwrap(), &[], &[]).unwrap();
        let fd = Fingerprint::of_training(&d.fingerprinted().unwrap(), &[], &[]).unwrap();
        assert!(fc.differences(&fd).iter().any(|l| l.starts_with("eval_interval")), "{:?}", fc.differences(&fd));
        // Retry settings may change on a resume, also against a fingerprint written when they counted.
        let mut e = a.clone();
        (e.comparator_api_timeout, e.comparator_api_max_attempts) = (600.0, 20);
        let fe = Fingerprint::of_training(&e.fingerprinted().unwrap(), &[], &[]).unwrap();
        assert!(fa.differences(&fe).is_empty(), "{:?}", fa.differences(&fe));
        let mut old = fa.clone();
        old.0.insert("comparator_api_timeout".into(), "120.0".into());
        assert!(old.differences(&fe).is_empty(), "{:?}", old.differences(&fe));
    }
}
