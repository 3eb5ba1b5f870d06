//! The API source: each role's candidates from an HTTP endpoint (`http::ApiClient`), one call
//! per item and role with its rendered `formatters` template (the endpoint applies its own chat
//! template). An answer is held to what the team's own actors may write: fewer completions than
//! asked is an error, and a longer one is cut at the actor's `max_new_tokens` (counted by its
//! tokenizer), so the round compares like with like and stays small.
use anyhow::{bail, Context, Result};

use super::http::{ApiClient, ApiKey, ApiSettings, RequestSampling, RetryPolicy};
use super::{render_roles, JointResponses, ResponseSource};
use crate::config::Config;
use crate::task::TaskItem;
use crate::team::Agent;

pub struct ApiSource<'a> {
    client: ApiClient,
    /// The team the answers stand beside (its tokenizers count their tokens).
    team: &'a [Agent],
    templates: Vec<String>,
    /// What a request for each role asks for.
    sampling: Vec<RequestSampling>,
}

impl<'a> ApiSource<'a> {
    pub fn new(cfg: &Config, team: &'a [Agent]) -> Result<Self> {
        let sampling = (0..team.len())
            .map(|a| RequestSampling {
                max_new_tokens: cfg.max_new_tokens()[a],
                temperature: cfg.temperature,
                top_p: cfg.top_p,
                top_k: cfg.top_k.map(|k| k as usize),
            })
            .collect();
        Ok(Self { client: ApiClient::new(settings(cfg)?), team, templates: cfg.role_templates(), sampling })
    }

    /// `n` answers to `prompt` in actor `actor`'s place, cut at its `max_new_tokens`
    /// (`truncated` counts the cut ones).
    pub fn complete(
        &self,
        prompt: &str,
        actor: usize,
        item: &TaskItem,
        n: usize,
        truncated: &mut usize,
    ) -> Result<Vec<String>> {
        let sampling = self.sampling[actor];
        let mut texts = self.client.complete(prompt, actor, &serde_json::to_value(item)?, n, sampling)?;
        // Fewer answers than asked would leave empty responses in the round as if written.
        if texts.len() < n {
            bail!(
                "the comparator API returned {} completions for agent {actor}, {n} were asked (prompt `{}`)",
                texts.len(),
                prompt.chars().take(60).collect::<String>()
            );
        }
        texts.truncate(n);
        let tok = &self.team[actor].model.tokenizer;
        for text in &mut texts {
            let ids = tok.encode(text)?;
            if ids.len() > sampling.max_new_tokens {
                *text = tok.decode(&ids[..sampling.max_new_tokens])?;
                *truncated += 1;
            }
        }
        Ok(texts)
    }
}

impl ResponseSource for ApiSource<'_> {
    fn sample(
        &self,
        items: &[TaskItem],
        n: usize,
        _seed: &dyn Fn(usize, usize, usize) -> u64,
        _on_tokens: &mut dyn FnMut(usize),
    ) -> Result<JointResponses> {
        let mut truncated = 0;
        let mut texts = Vec::with_capacity(items.len());
        for item in items {
            let per_role = render_roles(&self.templates, item)?
                .iter()
                .enumerate()
                .map(|(a, prompt)| self.complete(prompt, a, item, n, &mut truncated))
                .collect::<Result<Vec<_>>>()?;
            texts.push((0..n).map(|k| per_role.iter().map(|t| t[k].clone()).collect()).collect());
        }
        Ok(JointResponses { texts, rollout: None, unparsed: 0, truncated })
    }
}

/// The endpoint's settings; the key from `comparator_api_key_env` (or the discouraged
/// `comparator_api_key`), never shown.
pub fn settings(cfg: &Config) -> Result<ApiSettings> {
    let key = match (&cfg.comparator_api_key, &cfg.comparator_api_key_env) {
        (Some(k), _) => {
            tracing::warn!("comparator_api_key is set in the config; prefer comparator_api_key_env");
            ApiKey::new(k.clone())
        }
        (None, Some(var)) => {
            let k = std::env::var(var)
                .with_context(|| format!("comparator_api_key_env = \"{var}\": the environment variable is not set"))?;
            Some(ApiKey::new(k).with_context(|| format!("the environment variable {var} is empty"))?)
        }
        (None, None) => None,
    };
    let extra_body = match &cfg.comparator_api_extra_body {
        Some(t) => Some(serde_json::to_value(t)?.as_object().cloned().unwrap_or_default()),
        None => None,
    };
    Ok(ApiSettings {
        url: cfg.comparator_api_url.clone().context("comparator_policy = \"api\" needs comparator_api_url")?,
        format: cfg.modes.api_format,
        model: cfg.comparator_api_model.clone(),
        max_n_per_request: cfg.comparator_api_max_n_per_request.map(|n| n as usize),
        // Validated: positive, at most a week.
        timeout: std::time::Duration::from_secs_f64(cfg.comparator_api_timeout),
        headers: cfg.comparator_api_headers.clone().unwrap_or_default().into_iter().collect(),
        key,
        key_header: cfg.comparator_api_key_header.clone(),
        key_prefix: cfg.comparator_api_key_prefix.clone(),
        response_field: cfg.comparator_api_response_field.clone(),
        extra_body,
        retry: RetryPolicy { max_attempts: cfg.comparator_api_max_attempts as u32, ..RetryPolicy::default() },
    })
}
