//! The team: one model per agent, on the agent's device, with its prompt template.
use anyhow::{Context, Result};
use candle_core::Device;

use crate::config::{Config, DeviceSpec};
use crate::device::parse_device;
use crate::model::LoadedModel;
use crate::run_dir::RunDir;
use crate::task::{render_template, TaskItem};

pub struct Agent {
    pub index: usize,
    pub model: LoadedModel,
    pub device: Device,
    template: String,
    system_prompt: Option<String>,
    chat_template: bool,
}

impl Agent {
    /// The exact text this agent is given for an item: its template, then the chat template.
    pub fn prompt_for(&self, item: &TaskItem) -> Result<String> {
        let user = render_template(&self.template, item).with_context(|| format!("agent {} prompt", self.index))?;
        self.model.tokenizer.format_prompt(self.chat_template, self.system_prompt.as_deref(), &user)
    }
}

/// Load the team: the run's trained agents (`<run_dir>/agents/agent_i`) when they exist, else the
/// configured base models.
pub fn load_team(cfg: &Config, run_dir: &RunDir) -> Result<Vec<Agent>> {
    if cfg.collaboration_mode == "centralized" {
        anyhow::bail!(
            "collaboration_mode = \"centralized\" is not supported by this version of pbrl (use \"decentralized\")"
        );
    }
    let n = cfg.num_agents as usize;
    let sources = cfg.agent_sources()?;
    let devices = DeviceSpec::resolve(cfg.agent_devices.as_ref(), n, "agent_devices")?;
    let pick = |v: &[String], i: usize| {
        if v.len() == 1 {
            v[0].clone()
        } else {
            v[i].clone()
        }
    };
    (0..n)
        .map(|i| {
            let device = parse_device(&devices[i], &format!("agent_devices[{i}]"))?;
            let trained = run_dir.agent(i);
            let source =
                if trained.join("config.json").is_file() { trained.display().to_string() } else { sources[i].clone() };
            tracing::info!(agent = i, %source, "loading agent");
            let model =
                LoadedModel::load(&source, &device).with_context(|| format!("loading agent {i} from `{source}`"))?;
            Ok(Agent {
                index: i,
                model,
                device,
                template: pick(&cfg.task.formatters, i),
                system_prompt: cfg.task.system_prompts.as_ref().map(|s| pick(s, i)),
                chat_template: cfg.task.chat_template,
            })
        })
        .collect()
}
