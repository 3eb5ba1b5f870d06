//! The API source: each role's candidates from an HTTP endpoint (`http::ApiClient`), one call
//! per item and role with its rendered `formatters` template (the endpoint applies its own chat
//! template). An answer is held to what the team's own actors may write: fewer completions than
//! asked is an error, and a longer one is cut at the actor's `max_new_tokens` (counted by its
//! tokenizer), so the round compares like with like and stays small.
use anyhow::{bail, Context, Result};

use super::http::{ApiClient, ApiKey, ApiSettings, RequestSampling, RetryPolicy};
use super::{render_roles, JointResponses, ResponseSource};
use crate::config::ApiConfig;
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
    pub fn new(cfg: &ApiConfig, team: &'a [Agent]) -> Result<Self> {
        let sampling = cfg.sampling[..team.len()]
            .iter()
            .map(|s| RequestSampling {
                max_new_tokens: s.max_new_tokens,
                temperature: s.temperature,
                top_p: s.top_p,
                top_k: s.top_k,
            })
            .collect();
        Ok(Self { client: ApiClient::new(settings(cfg)?), team, templates: cfg.role_templates.clone(), sampling })
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
pub fn settings(cfg: &ApiConfig) -> Result<ApiSettings> {
    let key = match (&cfg.inline_key, &cfg.key_env) {
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
    Ok(ApiSettings {
        url: cfg.url.clone().context("comparator_policy = \"api\" needs comparator_api_url")?,
        format: cfg.format,
        model: cfg.model.clone(),
        max_n_per_request: cfg.max_n_per_request,
        // Validated: positive, at most a week.
        timeout: std::time::Duration::from_secs_f64(cfg.timeout_s),
        headers: cfg.headers.clone(),
        key,
        key_header: cfg.key_header.clone(),
        key_prefix: cfg.key_prefix.clone(),
        response_field: cfg.response_field.clone(),
        extra_body: cfg.extra_body.clone(),
        retry: RetryPolicy { max_attempts: cfg.max_attempts, ..RetryPolicy::default() },
    })
}
