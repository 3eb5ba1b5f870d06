//! Task rewards: a score for each joint response (one completion per agent).
use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::TaskItem;
use crate::config::RewardConfig;

/// A task reward. `completions[a]` is agent a's completion of the joint response.
pub trait TaskReward: Send {
    fn score(&mut self, item: &TaskItem, prompts: &[String], completions: &[String])
        -> Result<f64>;
}

/// The reference's quick-start length-ratio reward: agent 1's answer should be between
/// `target_min` and `target_max` times as long (in characters) as agent 0's.
/// 1 inside the band, `exp(-distance)` outside it, 0 when agent 0's answer is empty.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthRatio {
    #[serde(default = "two")]
    pub target_min: f64,
    #[serde(default = "three")]
    pub target_max: f64,
}
fn two() -> f64 {
    2.0
}
fn three() -> f64 {
    3.0
}

impl LengthRatio {
    pub fn value(&self, first: &str, second: &str) -> f64 {
        let l1 = first.chars().count();
        if l1 == 0 {
            return 0.0;
        }
        let ratio = second.chars().count() as f64 / l1 as f64;
        if ratio < self.target_min {
            (-(self.target_min - ratio)).exp()
        } else if ratio > self.target_max {
            (-(ratio - self.target_max)).exp()
        } else {
            1.0
        }
    }
}

impl TaskReward for LengthRatio {
    fn score(
        &mut self,
        _item: &TaskItem,
        _prompts: &[String],
        completions: &[String],
    ) -> Result<f64> {
        if completions.len() != 2 {
            bail!(
                "the length_ratio reward compares exactly 2 agents, got {}",
                completions.len()
            );
        }
        Ok(self.value(&completions[0], &completions[1]))
    }
}

/// `reward_processor`: x * scale + shift.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RewardProcessor {
    pub scale: f64,
    pub shift: f64,
}

impl RewardProcessor {
    pub fn apply(&self, x: f64) -> f64 {
        x * self.scale + self.shift
    }
}

/// The configured reward and its processor.
pub fn build_reward(cfg: &RewardConfig) -> Result<(Box<dyn TaskReward>, RewardProcessor)> {
    let params = toml::Value::Table(cfg.params.clone());
    let parse_err = |kind: &str| format!("[reward] parameters for kind `{kind}`");
    let reward: Box<dyn TaskReward> = match cfg.kind.as_str() {
        "length_ratio" => {
            let r: LengthRatio = serde_path_to_error::deserialize(params)
                .map_err(|e| anyhow::anyhow!("reward.{}: {}", e.path(), e.inner().message()))
                .with_context(|| parse_err("length_ratio"))?;
            if !(r.target_min > 0.0 && r.target_min <= r.target_max) {
                bail!("reward.target_min must be > 0 and <= reward.target_max");
            }
            Box::new(r)
        }
        other => bail!("unknown reward kind `{other}` (known: length_ratio)"),
    };
    Ok((
        reward,
        RewardProcessor {
            scale: cfg.scale,
            shift: cfg.shift,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_ratio_formula() {
        let r = LengthRatio {
            target_min: 2.0,
            target_max: 3.0,
        };
        assert_eq!(r.value("", "abc"), 0.0);
        assert_eq!(r.value("ab", "abcde"), 1.0); // 2.5
        assert_eq!(r.value("ab", "abcd"), 1.0); // exactly 2
        assert_eq!(r.value("ab", "abcdef"), 1.0); // exactly 3
        assert!((r.value("ab", "ab") - (-1.0f64).exp()).abs() < 1e-12); // ratio 1
        assert!((r.value("a", "abcde") - (-2.0f64).exp()).abs() < 1e-12); // ratio 5
        assert!((r.value("é", "日本") - 1.0).abs() < 1e-12); // characters, not bytes
    }

    #[test]
    fn unknown_kind_and_param_are_errors() {
        let mut cfg = RewardConfig {
            kind: "nope".into(),
            ..Default::default()
        };
        assert!(build_reward(&cfg)
            .err()
            .unwrap()
            .to_string()
            .contains("unknown reward kind `nope`"));
        cfg.kind = "length_ratio".into();
        cfg.params
            .insert("target_mn".into(), toml::Value::Float(1.0));
        let e = format!("{:#}", build_reward(&cfg).err().unwrap());
        assert!(e.contains("target_mn"), "{e}");
    }
}
