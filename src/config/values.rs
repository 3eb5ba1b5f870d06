//! Keys whose values come in more than one form: a device for every actor or one each, a
//! token limit for every actor or one each, the held-out share or the eval file.
use serde::{Deserialize, Deserializer, Serialize};

use super::{err, ConfigError};

/// One device string for every actor, or one per actor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DeviceSpec {
    One(String),
    PerActor(Vec<String>),
}

impl DeviceSpec {
    /// The device string of each of `n` actors.
    pub fn resolve(spec: Option<&DeviceSpec>, n: usize, key: &str) -> Result<Vec<String>, ConfigError> {
        match spec {
            None => Ok(vec!["cpu".to_string(); n]),
            Some(DeviceSpec::One(s)) if s == "auto" => Ok(vec!["cpu".to_string(); n]),
            Some(DeviceSpec::One(s)) => Ok(vec![s.clone(); n]),
            Some(DeviceSpec::PerActor(v)) if v.len() == n => Ok(v.clone()),
            Some(DeviceSpec::PerActor(v)) => err(format!("{key} has {} entries but there are {n} actors", v.len())),
        }
    }
}

/// `max_new_tokens`: one limit for every actor, or one per actor (a list, like
/// `task.formatters`), so a brief and a detailed writer can have limits of their own.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TokenLimit {
    One(i64),
    PerActor(Vec<i64>),
}

impl TokenLimit {
    /// The limit of each of `n` actors (validated: a list has one entry per actor, each >= 1).
    pub fn resolve(&self, n: usize) -> Result<Vec<usize>, ConfigError> {
        let limits = match self {
            TokenLimit::One(t) => vec![*t; n],
            TokenLimit::PerActor(v) if v.len() == n => v.clone(),
            TokenLimit::PerActor(v) => {
                return err(format!(
                    "max_new_tokens has {} entries but there are {n} actors; give one number or one per actor",
                    v.len()
                ))
            }
        };
        if limits.iter().any(|&t| t < 1) {
            return err("max_new_tokens must be >= 1.");
        }
        Ok(limits.into_iter().map(|t| t as usize).collect())
    }
}

impl<'de> Deserialize<'de> for TokenLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(i64),
            PerActor(Vec<i64>),
            Other(toml::Value),
        }
        match Raw::deserialize(d)? {
            Raw::One(t) => Ok(TokenLimit::One(t)),
            Raw::PerActor(v) => Ok(TokenLimit::PerActor(v)),
            Raw::Other(v) => Err(serde::de::Error::custom(format!(
                "invalid value `{v}` (use an integer, or a list of integers with one per actor)"
            ))),
        }
    }
}

/// The items of the periodic evaluation during training: the eval file, a validation file
/// (`task.validation_file`, prompts that neither training nor `pbrl eval` uses), or a share of
/// the train items (a number in (0, 1)) held out from collection and training.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EvalSplit {
    EvalFile,
    ValidationFile,
    TrainShare(f64),
}

impl Serialize for EvalSplit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            EvalSplit::EvalFile => s.serialize_str("eval_file"),
            EvalSplit::ValidationFile => s.serialize_str("validation_file"),
            EvalSplit::TrainShare(x) => s.serialize_f64(*x),
        }
    }
}

impl<'de> Deserialize<'de> for EvalSplit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Share(f64),
            Word(String),
        }
        match Raw::deserialize(d)? {
            Raw::Share(x) => Ok(EvalSplit::TrainShare(x)),
            Raw::Word(w) if w == "eval_file" => Ok(EvalSplit::EvalFile),
            Raw::Word(w) if w == "validation_file" => Ok(EvalSplit::ValidationFile),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "invalid value `{w}` (use \"eval_file\", \"validation_file\" or a share of the train items in (0, 1))"
            ))),
        }
    }
}

/// One value for every actor, or a list with one per actor (as `max_new_tokens` and
/// `task.formatters`): `agent_lora`'s adapter shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PerActor<T> {
    One(T),
    Each(Vec<T>),
}

impl<T> PerActor<T> {
    /// Actor `i`'s value (a validated config's lists have one entry per actor: [`Self::check_len`]).
    pub fn of(&self, i: usize) -> &T {
        match self {
            PerActor::One(v) => v,
            PerActor::Each(v) => &v[i],
        }
    }

    /// Every value given.
    pub fn values(&self) -> Vec<&T> {
        match self {
            PerActor::One(v) => vec![v],
            PerActor::Each(v) => v.iter().collect(),
        }
    }

    /// A list must have one entry per actor (`key` names it in the error).
    pub fn check_len(&self, n: usize, key: &str) -> Result<(), ConfigError> {
        match self {
            PerActor::Each(v) if v.len() != n => {
                err(format!("{key} has {} entries but there are {n} actors; give one value or one per actor", v.len()))
            }
            _ => Ok(()),
        }
    }
}

/// A value of `T` stands for every actor; otherwise a list of `T` gives one per actor (a `T`
/// that is itself a list, such as `target_modules`, is read whole first).
impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for PerActor<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = toml::Value::deserialize(d)?;
        let one_error = match T::deserialize(value.clone()) {
            Ok(one) => return Ok(PerActor::One(one)),
            Err(e) => e.to_string(),
        };
        match value {
            toml::Value::Array(items) => items
                .into_iter()
                .map(T::deserialize)
                .collect::<Result<Vec<T>, _>>()
                .map(PerActor::Each)
                .map_err(|e| serde::de::Error::custom(format!("{e} (in the list with one value per actor)"))),
            _ => Err(serde::de::Error::custom(format!("{one_error} (give one value, or a list with one per actor)"))),
        }
    }
}

/// `early_termination_threshold`: a number, or "none" for no early termination.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    At(f64),
    Never,
}

impl Threshold {
    /// The threshold a branch's mean reward must exceed to end, if any.
    pub fn value(self) -> Option<f64> {
        match self {
            Threshold::At(t) => Some(t),
            Threshold::Never => None,
        }
    }
}

impl Serialize for Threshold {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Threshold::At(t) => s.serialize_f64(*t),
            Threshold::Never => s.serialize_str("none"),
        }
    }
}

impl<'de> Deserialize<'de> for Threshold {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match toml::Value::deserialize(d)? {
            toml::Value::Float(t) => Ok(Threshold::At(t)),
            toml::Value::Integer(t) => Ok(Threshold::At(t as f64)),
            toml::Value::String(w) if matches!(w.to_lowercase().as_str(), "none" | "null" | "") => Ok(Threshold::Never),
            other => Err(serde::de::Error::custom(format!("invalid value `{other}` (give a number, or \"none\")"))),
        }
    }
}
