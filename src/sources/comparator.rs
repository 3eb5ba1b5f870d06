//! `iterate`'s comparator (reference §8.2), built from the config for one round:
//! - `current`: the team's own agents under their own seeded stream;
//! - `current_copy`: the agents as they are, loaded onto `comparator_devices` (the team itself
//!   when those are the agents' devices);
//! - `model`: `comparator_agents`, or `comparator_model_name` for every role;
//! - `history`: the team `comparator_history_k` rounds back (`policy_checkpoints/`), the base
//!   models before there is one;
//! - `api`: an HTTP endpoint.
//!
//! With `comparator_generation_mode = "centralized"` (and a decentralized team), actor
//! `comparator_centralized_agent_index` of that comparator (or one API call) writes every role.
use anyhow::Result;

use super::api::ApiSource;
use super::{Agents, Centralized, ResponseSource, TeamSource, Writer};
use crate::config::{ComparatorConfig, ComparatorPolicy};
use crate::run::team::{saved_team, MANIFEST};
use crate::run::RunDir;
use crate::team::{frozen_storage, load_as, Agent};

/// Who answers a round's comparator side.
pub enum Comparator<'a> {
    /// The team itself (`current`, or `current_copy` on the agents' own devices), each role
    /// written by its own actor: its candidates are sampled in the team's own sampling call,
    /// under the comparator's stream, so each prompt is prefilled once and the decoding steps
    /// carry both sides' rows.
    Team,
    /// Any other source.
    Source(Box<dyn ResponseSource + 'a>),
}

/// The comparator of round `round` of a team.
pub fn build<'a>(cfg: &ComparatorConfig, run_dir: &RunDir, round: u32, team: &'a [Agent]) -> Result<Comparator<'a>> {
    let load = |sources: &[String]| -> Result<Agents<'a>> {
        Ok(Agents::Owned(load_as(team, sources, &cfg.devices, frozen_storage(cfg.frozen_dtype), "comparator")?))
    };
    let agents = match &cfg.policy {
        ComparatorPolicy::Current => Agents::Borrowed(team),
        ComparatorPolicy::CurrentCopy if cfg.devices == cfg.agent_devices => Agents::Borrowed(team),
        ComparatorPolicy::CurrentCopy => {
            let sources = match saved_team(&run_dir.agents(), team.len())? {
                Some(dirs) => dirs.iter().map(|d| d.display().to_string()).collect(),
                None => cfg.agent_sources.clone(),
            };
            load(&sources)?
        }
        ComparatorPolicy::Model(sources) => load(sources)?,
        ComparatorPolicy::History(k) => {
            let target = round as i64 - 1 - *k as i64;
            let snapshot = (0..=target.max(-1))
                .rev()
                .filter(|&j| j >= 0)
                .map(|j| run_dir.policy_snapshot(j as usize))
                .find(|d| d.join(MANIFEST).is_file());
            let sources = match snapshot.map(|d| saved_team(&d, team.len())).transpose()?.flatten() {
                Some(dirs) => dirs.iter().map(|d| d.display().to_string()).collect(),
                None => cfg.agent_sources.clone(), // the initial policy: the base models
            };
            load(&sources)?
        }
        ComparatorPolicy::Api => {
            let api = ApiSource::new(&cfg.api, team)?;
            return Ok(Comparator::Source(match cfg.writer {
                Some(index) => Box::new(Centralized {
                    writer: Writer::Api(Box::new(api)),
                    index,
                    templates: cfg.role_templates.clone(),
                }),
                None => Box::new(api),
            }));
        }
    };
    if matches!(agents, Agents::Borrowed(_)) && cfg.writer.is_none() {
        return Ok(Comparator::Team);
    }
    let source = TeamSource::new(agents, cfg.sampling.clone());
    Ok(Comparator::Source(match cfg.writer {
        Some(index) => {
            Box::new(Centralized { writer: Writer::Agent(source), index, templates: cfg.role_templates.clone() })
        }
        None => Box::new(source),
    }))
}
