//! pbrl: multi-agent preference-based RL for teams of LLM agents, on candle.
//!
//! Data flows one way: command line → [`config`] → a stage in [`stages`] (a recipe) → the
//! library: rounds of preference pairs ([`rounds`], from [`sources`], scored by the [`oracle`]),
//! training ([`train`], [`reward_model`]), evaluation ([`evaluation`], [`report`]) → the team
//! of agents ([`team`]) and the model runtime (the `pbrl-model` crate) → candle; every artefact
//! lives in the run directory ([`run`]).
pub mod algo;
pub mod cli;
pub mod config;
pub mod device;
pub mod evaluation;
pub mod oracle;
pub mod plot;
pub mod prefs;
pub mod progress;
pub mod report;
pub mod reward_model;
pub mod rng;
pub mod rounds;
pub mod run;
pub mod sources;
pub mod stages;
pub mod task;
pub mod team;
pub mod train;
