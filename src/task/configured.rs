//! The configured reward: the `[reward]` table's kind and parameters → a reward and its
//! processor.
use anyhow::{bail, Context, Result};

use super::command::{CommandParams, CommandReward};
use super::reward::{Keywords, LengthRatio, NumericAnswer, RewardProcessor, TaskReward, TldrLength};
use crate::config::RewardConfig;

/// Parse a reward's parameters from the `[reward]` table, naming the key on error.
fn params<T: serde::de::DeserializeOwned>(cfg: &RewardConfig) -> Result<T> {
    serde_path_to_error::deserialize(toml::Value::Table(cfg.params.clone()))
        .map_err(|e| {
            let path = e.path().to_string();
            let at = if path == "." || path.is_empty() { String::new() } else { format!(".{path}") };
            anyhow::anyhow!("reward{at}: {}", e.inner().message())
        })
        .with_context(|| format!("[reward] parameters for kind `{}`", cfg.kind))
}

/// The configured reward and its processor.
pub fn build_reward(cfg: &RewardConfig, timeout_s: f64) -> Result<(Box<dyn TaskReward>, RewardProcessor)> {
    let reward: Box<dyn TaskReward> = match cfg.kind.as_str() {
        "length_ratio" => {
            let r: LengthRatio = params(cfg)?;
            if !(r.target_min > 0.0 && r.target_min <= r.target_max) {
                bail!("reward.target_min must be > 0 and <= reward.target_max");
            }
            Box::new(r)
        }
        "tldr_length" => Box::new(params::<TldrLength>(cfg)?),
        "numeric_answer" => Box::new(params::<NumericAnswer>(cfg)?),
        "keywords" => {
            let k: Keywords = params(cfg)?;
            Box::new(k.compile()?)
        }
        "command" => {
            let c: CommandParams = params(cfg)?;
            Box::new(CommandReward::spawn(&c.command, &c.env, timeout_s)?)
        }
        other => {
            bail!("unknown reward kind `{other}` (known: length_ratio, tldr_length, numeric_answer, keywords, command)")
        }
    };
    Ok((reward, RewardProcessor { scale: cfg.scale, shift: cfg.shift }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kind_and_param_are_errors() {
        let mut cfg = RewardConfig { kind: "nope".into(), ..Default::default() };
        assert!(build_reward(&cfg, 1.0).err().unwrap().to_string().contains("unknown reward kind `nope`"));
        cfg.kind = "length_ratio".into();
        cfg.params.insert("target_mn".into(), toml::Value::Float(1.0));
        let e = format!("{:#}", build_reward(&cfg, 1.0).err().unwrap());
        assert!(e.contains("target_mn"), "{e}");
    }
}
