//! The multi-turn keys' rules (pbrl's own: the reference's preference trainers refuse
//! `num_turns` > 1): `joint_mode`, `discount`, `early_termination_threshold`, `history_reward`,
//! `rl_reward` and the `[transition]` table; and which stages run more than one turn.
use super::rules::MAX_SECONDS;
use super::{err, Config, ConfigError, MarlhfBackend};

impl Config {
    pub(super) fn validate_turns(&mut self) -> Result<(), ConfigError> {
        self.joint_mode = match self.joint_mode.trim().to_lowercase().as_str() {
            "align" | "aligned" => "aligned".into(),
            "cross" => "cross".into(),
            _ => return err("joint_mode must be 'aligned' or 'cross'."),
        };
        if !matches!(self.history_reward.as_str(), "last" | "sum") {
            return err("history_reward must be \"last\" or \"sum\".");
        }
        if !matches!(self.rl_reward.as_str(), "reward_model" | "task") {
            return err("rl_reward must be \"reward_model\" or \"task\".");
        }
        if let Some(t) = self.early_termination_threshold.and_then(|t| t.value()) {
            if !t.is_finite() {
                return err("early_termination_threshold must be a finite number or \"none\".");
            }
        }
        if let Some(t) = &self.transition {
            match t.kind.as_str() {
                "debate" if !t.command.is_empty() || !t.env.is_empty() => {
                    return err("transition.command and transition.env belong to kind = \"command\", not \"debate\"");
                }
                "debate" => {
                    if let Some(template) = &t.template {
                        template.check_len(self.num_actors(), "transition.template")?;
                    }
                }
                "command" if t.template.is_some() => {
                    return err("transition.template belongs to kind = \"debate\", not \"command\"");
                }
                "command" if t.command.is_empty() => {
                    return err("transition kind = \"command\" needs transition.command = [program, args...]");
                }
                "command" => {}
                other => return err(format!("transition.kind = \"{other}\": give \"debate\" or \"command\"")),
            }
            if !(t.timeout_s > 0.0 && t.timeout_s <= MAX_SECONDS) {
                return err("transition.timeout_s must be a positive number of seconds, at most a week (604800).");
            }
        }
        if self.num_turns == 1 {
            return Ok(());
        }
        if self.transition.is_none() {
            return err(format!(
                "num_turns = {} needs a [transition] table (kind = \"debate\" or \"command\"): what the agents are \
                 asked after the first turn",
                self.num_turns
            ));
        }
        if self.discount != 1.0 {
            return err(format!(
                "discount = {}: multi-turn returns are undiscounted sums over the turns (as CoMLRL 1.4.3 computes \
                 them); set discount = 1.0",
                self.discount
            ));
        }
        if !self.external_prompt_passthrough {
            if let Some(f) = self.task.formatters.iter().find(|f| !f.contains("{prompt}")) {
                return err(format!(
                    "num_turns > 1: the transition's text stands in the item's `prompt` under each agent's template, \
                     but task.formatters `{f}` has no {{prompt}}, so later turns would not show it; add {{prompt}}, or \
                     set external_prompt_passthrough = true for the transition to write the whole message"
                ));
            }
        }
        if self.collaboration_mode == "centralized" {
            return err("num_turns > 1 with collaboration_mode = \"centralized\" is not supported: one actor writing \
                        every role has no one else's answer to read");
        }
        Ok(())
    }

    /// Refuse, for a stage that runs one turn, a config that asks for more (`stage`: its name).
    pub fn single_turn(&self, stage: &str) -> Result<(), ConfigError> {
        if self.num_turns > 1 {
            return err(format!(
                "num_turns = {}: `pbrl {stage}` runs single-turn discussions only so far; multi-turn runs are \
                 `pbrl collect`, `pbrl train-madpo`, `pbrl train-marlhf` (the MAGRPO family) and `pbrl eval`",
                self.num_turns
            ));
        }
        self.aligned(stage)
    }

    /// Refuse, for a stage that pairs aligned joint responses, cross joint actions.
    pub fn aligned(&self, stage: &str) -> Result<(), ConfigError> {
        if self.joint_mode == "cross" {
            return err(format!(
                "joint_mode = \"cross\": `pbrl {stage}` pairs aligned joint responses; cross joint actions are \
                 `pbrl train-marlhf`'s (the MAGRPO family)"
            ));
        }
        Ok(())
    }

    /// Refuse, for `train-marlhf`, what its backends do not run: more turns or cross joint actions
    /// beyond the MAGRPO family.
    pub fn marlhf_turns(&self) -> Result<(), ConfigError> {
        let family = matches!(self.modes.marlhf, MarlhfBackend::PolicyGradient(_));
        if !family && (self.num_turns > 1 || self.joint_mode == "cross") {
            return err(format!(
                "rl_algorithm = \"{}\": num_turns > 1 and joint_mode = \"cross\" run with the MAGRPO family (magrpo, \
                 mareinforce, maremax, marloo) so far",
                self.rl_algorithm
            ));
        }
        Ok(())
    }
}
