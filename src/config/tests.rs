//! The configuration's rules and messages.
use super::*;

fn load(text: &str, overrides: &[&str]) -> Result<Config, ConfigError> {
    let o: Vec<Override> = overrides.iter().map(|s| Override::parse(s).unwrap()).collect();
    Config::from_toml_str(text, "test.toml", &o)
}

fn message(text: &str, overrides: &[&str]) -> String {
    load(text, overrides).unwrap_err().0
}

#[test]
fn defaults_are_the_reference_madpo_defaults() {
    let c = load("", &[]).unwrap();
    assert_eq!(c.num_train_epochs, 20);
    assert_eq!(c.agent_learning_rate, 5e-6);
    assert_eq!(c.preference_num_candidates, 80);
    assert_eq!(c.preference_pairs_per_sample, Some(16));
    assert_eq!(c.pair_selection, "reward_gap");
    assert_eq!(c.dpo_beta, 0.1);
    assert_eq!(c.max_new_tokens(), vec![256, 256]);
    assert_eq!((c.temperature, c.top_p, c.top_k), (0.6, 0.6, Some(50)));
    assert_eq!(c.eval_interval, 16);
    assert_eq!(c.pairs_per_update(), 2, "train_batch_size defaults to rollout_buffer_size");
}

/// One number is every actor's limit; a list gives each actor its own, in the sampling settings
/// every stage uses; the one-number form is written back as it was (run fingerprints unchanged).
#[test]
fn max_new_tokens_is_one_number_or_one_per_actor() {
    let one = load("max_new_tokens = 48", &[]).unwrap();
    assert_eq!(one.max_new_tokens(), vec![48, 48]);
    assert!(one.to_toml().contains("max_new_tokens = 48\n"));
    let each = load("max_new_tokens = 48", &["max_new_tokens=[32, 160]"]).unwrap();
    assert_eq!(each.max_new_tokens(), vec![32, 160]);
    assert_eq!(each.sampling().iter().map(|s| s.max_new_tokens).collect::<Vec<_>>(), vec![32, 160]);
    let centralized = load("collaboration_mode = \"centralized\"\nmax_new_tokens = [90]\nagents = [\"m\"]", &[]);
    assert_eq!(centralized.unwrap().max_new_tokens(), vec![90], "one actor writes every role");
}

/// Every validation rule, with its message.
#[test]
fn each_rule_reports_its_message() {
    let cases: &[(&str, &str)] = &[
        ("[task]\nformatters = [\"{prompt}\", \" \"]", "task.formatters[1] is empty: an agent's prompt would be nothing"),
        ("collaboration_mode = \"central\"", "collaboration_mode must be 'decentralized' or 'centralized'."),
        ("num_train_epochs = 0", "num_train_epochs must be >= 1."),
        ("num_train_epochs = 4294967297", "num_train_epochs must be <= 100000."),
        ("[agent_lora]\nr = 0", "agent_lora.r must be in [1, 1024]."),
        ("[agent_lora]\nalpha = 0.0", "agent_lora.alpha must be > 0."),
        ("[agent_lora]\ndropout = 1.0", "agent_lora.dropout must be in [0, 1)"),
        ("[reward_lora]\ndropout = -0.1", "reward_lora.dropout must be in [0, 1)"),
        ("[agent_lora]\ntarget_modules = [\"qproj\"]", "`qproj` is not one of"),
        ("[agent_lora]\ntarget_modules = []", "agent_lora.target_modules is empty"),
        ("[agent_lora]\nbase_dtype = \"q4\"", "unknown variant `q4`, expected one of `f32`, `bf16`, `q8_0`"),
        ("comparator_api_headers = { \"X-A\" = \"a\\nb\" }", "comparator_api_headers: `X-A` is not a valid HTTP header"),
        ("comparator_api_headers = { \"X A\" = \"b\" }", "comparator_api_headers: `X A` is not a valid HTTP header"),
        ("comparator_api_key_header = \"a:b\"", "comparator_api_key_header must be an HTTP header name"),
        ("comparator_api_key_prefix = \"x\\r\"", "comparator_api_key_prefix must not hold line breaks"),
        ("num_agents = 0", "num_agents must be >= 1."),
        ("rollout_buffer_size = 0", "rollout_buffer_size must be >= 1."),
        ("eval_interval = -1", "eval_interval must be >= 0."),
        ("eval_num_samples = -1", "eval_num_samples must be >= 0."),
        ("eval_batch_size = 0", "eval_batch_size must be >= 1."),
        ("eval_samples_per_item = 0", "eval_samples_per_item must be >= 1."),
        ("num_turns = 0", "num_turns must be >= 1."),
        ("logging_steps = 0", "logging_steps must be >= 1."),
        ("train_batch_size = 0", "train_batch_size must be >= 1."),
        ("parallel_training = \"ddp\"", "parallel_training must be one of: none, mp."),
        ("parallel_training = \"MP\"", "parallel_training='mp' requires agent_devices."),
        ("reference_kl_coef = -0.1", "reference_kl_coef must be >= 0."),
        ("num_turns = 2", "num_turns = 2 needs a [transition] table"),
        ("preference_num_candidates = 1", "preference_num_candidates must be >= 2."),
        ("preference_pairs_per_sample = 0", "preference_pairs_per_sample must be null or >= 1."),
        ("dpo_beta = 0.0", "dpo_beta must be > 0."),
        ("environment_steps_per_pair = 0", "environment_steps_per_pair must be >= 1."),
        ("pair_selection = \"best\"", "pair_selection must be one of: reward_gap, all, random."),
        ("pair_selection = \"all\"", "preference_pairs_per_sample must be null when pair_selection='all'."),
        ("joint_mode = \"crossed\"", "joint_mode must be 'aligned' or 'cross'."),
        ("advantage_mode = \"median\"", "advantage_mode must be one of: mean, raw, max, rloo."),
        ("max_new_tokens = 0", "max_new_tokens must be >= 1."),
        ("max_new_tokens = [64, 0]", "max_new_tokens must be >= 1."),
        ("lr_scheduler_type = \"cosine\"", "unknown variant `cosine`, expected `constant` or `linear`"),
        ("max_new_tokens = [64]", "max_new_tokens has 1 entries but there are 2 actors"),
        (
            "max_new_tokens = \"long\"",
            "invalid value `\"long\"` (use an integer, or a list of integers with one per actor)",
        ),
        ("reference_model_name = \"m\"", "reference_model_name is set but unused"),
        ("eval_split = 1.0", "eval_split must be \"eval_file\", \"validation_file\" or a share of the train items in (0, 1)."),
        ("eval_split = \"validation_file\"", "eval_split = \"validation_file\" needs task.validation_file"),
        ("eval_split = \"train\"", "invalid value `train`"),
        ("keep_best = true\neval_interval = 0", "keep_best needs periodic evaluations"),
        ("keep_best = true\nkeep_best_tolerance = -1.0", "keep_best_tolerance must be a number >= 0"),
        ("keep_best_tolerance = 1.0", "keep_best_tolerance is set but keep_best is false"),
        ("reward_learning_rate = 0.0", "reward_learning_rate must be > 0."),
        ("reward_num_train_epochs = 0", "reward_num_train_epochs must be >= 1."),
        ("reward_num_train_epochs = 100001", "reward_num_train_epochs must be <= 100000."),
        ("reward_train_batch_size = 0", "reward_train_batch_size must be >= 1."),
        ("reward_max_length = 0", "reward_max_length must be >= 1 or null."),
        ("rl_algorithm = \"ppo\"", "rl_algorithm must be one of: magrpo, mareinforce, maremax, marloo, maac, iac."),
        ("num_generations = 1", "num_generations must be >= 2 for MAGRPO-family MARLHF backends."),
        ("rl_algorithm = \"iac\"\nnum_generations = 0", "num_generations must be >= 1."),
        ("reward_eval_fraction = 1.0", "reward_eval_fraction must be in [0, 1)"),
        ("reward_fresh_samples = 65", "reward_fresh_samples must be 0 (not measured) or in [2, 64]"),
        ("reward_fresh_samples = 1", "an order needs two samples"),
        ("reward_head_hidden = 8", "reward_head_hidden sets the hidden layer of reward_head = \"pooled_mlp\""),
        ("reward_head = \"pooled_mlp\"\nreward_head_hidden = 0", "reward_head_hidden must be in [1, 65536]"),
        ("value_head_hidden_dim = 100000000000", "value_head_hidden_dim must be in [1, 65536] or null"),
        ("critic_value_head_hidden_dim = 65537", "critic_value_head_hidden_dim must be in [1, 65536] or null"),
        ("num_iterations = 4294967297", "num_iterations must be in [1, 100000]."),
        ("comparator_api_max_attempts = 4294967296", "comparator_api_max_attempts must be in [1, 100]."),
        (
            "comparator_api_timeout = 1e20",
            "comparator_api_timeout must be a positive number of seconds, at most a week",
        ),
        ("reward_head = \"mean\"", "unknown variant `mean`, expected `last_token` or `pooled_mlp`"),
        ("critic_learning_rate = 0.0", "critic_learning_rate must be > 0 or null."),
        ("critic_type = \"a\"", "critic_type must be one of: v, q."),
        ("value_loss_coef = 0.0", "value_loss_coef must be > 0."),
        ("value_clip_range = -0.1", "value_clip_range must be > 0 or null."),
        ("value_head_hidden_dim = 0", "value_head_hidden_dim must be in [1, 65536] or null"),
        ("critic_devices = [\"cpu\"]", "critic_devices has 1 entries but there are 2 actors"),
        ("temperature = -1.0", "temperature must be >= 0"),
        ("top_p = 0.0", "top_p must be in (0, 1]."),
        ("top_k = 0", "top_k must be null or >= 1."),
        ("[task]\nformatters = [\"a\", \"b\", \"c\"]", "task.formatters has 3 templates"),
        ("[task]\nsystem_prompts = [\"a\", \"b\", \"c\"]", "task.system_prompts has 3 entries"),
        ("[task.chat_template_kwargs]\nmessages = []", "task.chat_template_kwargs.messages is set by pbrl itself"),
        ("agent_devices = [\"cpu\"]", "agent_devices has 1 entries but there are 2 actors"),
        ("reward_timeout_s = 0.0", "reward_timeout_s must be a positive number of seconds"),
        ("reward_timeout_s = 1e20", "at most a week"),
        ("agent_learning_rate = -1e-5", "agent_learning_rate must be > 0."),
        ("agent_model = \"a\"\nagents = [\"b\", \"c\"]", "agent_model and agents are both set"),
        ("collect_batch_size = 0", "collect_batch_size must be >= 1."),
        ("preference_replay_mode = \"best\"", "preference_replay_mode must be one of"),
        ("preference_replay_k = 2", "preference_replay_k must be null or 1 when preference_replay_mode='current'."),
        ("preference_replay_lambda = 0.5", "preference_replay_lambda is only valid when"),
        (
            "preference_replay_sample_size = 4",
            "preference_replay_sample_size is only valid when preference_replay_mode is",
        ),
        ("preference_replay_mode = \"k\"", "preference_replay_k is required when preference_replay_mode='nearest_k'."),
        ("preference_replay_mode = \"last_k\"\npreference_replay_k = 0", "preference_replay_k must be >= 1."),
        (
            "preference_replay_mode = \"all_history\"\npreference_replay_k = 2",
            "preference_replay_k is only valid when preference_replay_mode='nearest_k'.",
        ),
        (
            "preference_replay_mode = \"all_history\"\npreference_replay_sample_size = 0",
            "preference_replay_sample_size must be null or >= 1.",
        ),
        ("preference_replay_mode = \"td-lambda\"", "preference_replay_lambda is required when"),
        (
            "preference_replay_mode = \"lambda\"\npreference_replay_lambda = 1.5",
            "preference_replay_lambda must be in [0, 1].",
        ),
        ("checkpoint_interval = -1", "checkpoint_interval must be >= 0"),
        ("checkpoint_total_limit = 0", "checkpoint_total_limit must be null or >= 1."),
        ("items_per_round = 0", "items_per_round must be null or >= 1."),
        ("reward_range = [1.0, 0.0]", "reward_range must be [min, max] with min < max and max - min finite."),
        (
            "comparator_api_key_env = \"MY_KEY\"\n[reward]\nkind = \"command\"\ncommand = [\"x\"]\nenv = [\"LC_ALL\", \"MY_KEY\"]",
            "reward.env names `MY_KEY`, the comparator's API key variable",
        ),
        ("reward_range = [-1e308, 1e308]", "reward_range must be [min, max] with min < max and max - min finite."),
        ("log_reward_distribution = true", "log_reward_distribution needs reward_range = [min, max]"),
    ];
    for (text, want) in cases {
        let m = message(text, &[]);
        assert!(m.starts_with("test.toml: ") && m.contains(want), "{text:?}: got {m:?}, want {want:?}");
    }
}

#[test]
fn non_finite_values_and_override_mistakes_name_their_place() {
    assert_eq!(message("seed = 1\ndpo_beta = nan", &[]), "test.toml line 2: `dpo_beta` = nan is not a finite number");
    assert!(message("[reward]\nscale = -inf", &[]).contains("`reward.scale` = -inf is not a finite number"));
    assert!(message("", &["reward.target_min=nan"]).contains("`reward.target_min` = nan"));
    let m = message("", &["temperature=inf"]);
    assert!(m.starts_with("command-line override `temperature=inf`"), "{m}");
    let m = message("", &["dpo_beta=-1.0"]);
    assert!(m.starts_with("command-line override `dpo_beta=-1.0`: dpo_beta must be > 0"), "{m}");
    // The override the message is about, not one whose key it names as a value.
    let m = message("", &["task.eval_file=\"e.jsonl\"", "eval_split=0"]);
    assert!(m.starts_with("command-line override `eval_split=0`"), "{m}");
    let m = message("", &["num_agents=\"two\""]);
    assert!(m.starts_with("command-line override `num_agents=\"two\"`"), "{m}");
}

#[test]
fn normalizations_and_none_values() {
    let c =
        load("pair_selection = \" ALL \"\npreference_pairs_per_sample = \"none\"\nparallel_training = \"null\"", &[])
            .unwrap();
    assert_eq!(c.pair_selection, "all");
    assert_eq!(c.preference_pairs_per_sample, None);
    assert_eq!(c.parallel_training, "none");
    assert_eq!(load("", &["top_k=none"]).unwrap().top_k, None);
    for (alias, mode) in [("latest", "current"), ("recent_k", "nearest_k"), ("TD-Lambda", "lambda_decay")] {
        let extra = match mode {
            "nearest_k" => "preference_replay_k=2",
            "lambda_decay" => "preference_replay_lambda=0.5",
            _ => "seed=1",
        };
        let c = load("", &[&format!("preference_replay_mode={alias}"), extra]).unwrap();
        assert_eq!(c.preference_replay_mode, mode);
    }
}

#[test]
fn unknown_keys_name_the_line_and_the_closest_key() {
    assert_eq!(
        message("seed = 1\ndpo_betta = 0.2\n", &[]),
        "test.toml line 2: unknown key `dpo_betta`; did you mean `dpo_beta`?"
    );
    assert_eq!(
        message("[task]\ntrain_fil = \"x\"\n", &[]),
        "test.toml line 2: unknown key `task.train_fil`; did you mean `task.train_file`?"
    );
    assert_eq!(
        message("", &["max_new_token=3"]),
        "command-line override: unknown key `max_new_token`; did you mean `max_new_tokens`?"
    );
    assert_eq!(message("", &["zzzzzzzzzzzz=1"]), "command-line override: unknown key `zzzzzzzzzzzz`");
}

#[test]
fn type_errors_name_the_key_and_syntax_errors_the_line() {
    let m = message("dpo_beta = \"high\"", &[]);
    assert!(m.contains("`dpo_beta`"), "{m}");
    let m = message("seed = 1\nnum_agents = = 2\n", &[]);
    assert!(m.starts_with("test.toml line 2:"), "{m}");
}

#[test]
fn overrides_are_toml_literals_or_bare_words() {
    let c = load(
        "agent_learning_rate = 1e-5",
        &[
            "agent_learning_rate=2e-5",
            "task.eval_file=data/x.jsonl",
            "task.formatters=[\"{prompt}!\"]",
            "reward.kind=length_ratio",
        ],
    )
    .unwrap();
    assert_eq!(c.agent_learning_rate, 2e-5);
    assert_eq!(c.task.eval_file.as_deref(), Some(Path::new("data/x.jsonl")));
    assert_eq!(c.task.formatters, vec!["{prompt}!"]);
    assert_eq!(Override::parse("comparator_policy=model").unwrap().value, toml::Value::String("model".into()));
    assert!(Override::parse("novalue").is_err());
    assert!(message("seed = 1", &["seed.x=1"]).contains("`seed` is not a table"));
    assert!(message("", &["seed.x=1"]).contains("`seed`"));
}

#[test]
fn resolved_config_round_trips() {
    let c = load("seed = 7\n[reward]\nkind = \"length_ratio\"\ntarget_min = 1.5", &[]).unwrap();
    let again = Config::from_toml_str(&c.to_toml(), "resolved", &[]).unwrap();
    assert_eq!(c, again);
}

#[test]
fn agent_sources() {
    assert!(load("", &[]).unwrap().agent_sources().unwrap_err().0.contains("agent_model"));
    assert_eq!(load("agent_model = \"m.gguf\"", &[]).unwrap().agent_sources().unwrap(), vec!["m.gguf", "m.gguf"]);
    assert!(load("agents = [\"a\"]", &[]).unwrap().agent_sources().unwrap_err().0.contains("num_agents is 2"));
    let central = |extra: &str| load(&format!("collaboration_mode = \"centralized\"\n{extra}"), &[]).unwrap();
    assert_eq!(central("agent_model = \"m\"").agent_sources().unwrap(), vec!["m"]);
    assert_eq!(central("agents = [\"a\"]").agent_sources().unwrap(), vec!["a"]);
    assert!(central("agents = [\"a\", \"b\"]").agent_sources().unwrap_err().0.contains("exactly one actor"));
}

#[test]
fn the_reward_model_defaults_to_the_first_actor() {
    let c = load("agents = [\"a\", \"b\"]\nagent_devices = [\"cuda:1\", \"cpu\"]", &[]).unwrap();
    assert_eq!(c.reward_model_source().unwrap(), ("a".to_string(), "cuda:1".to_string()));
    let c = load("agent_model = \"m\"\nreward_model_name = \"r\"\nreward_model_device = \"cpu\"", &[]).unwrap();
    assert_eq!(c.reward_model_source().unwrap(), ("r".to_string(), "cpu".to_string()));
    assert_eq!((c.reward_learning_rate, c.reward_num_train_epochs, c.reward_train_batch_size), (1e-5, 1, 1));
    assert_eq!((c.reward_max_length, c.reward_freeze_backbone, c.reward_eval_fraction), (None, false, 0.1));
    assert_eq!((c.rl_algorithm.as_str(), c.num_generations), ("magrpo", 4));
    assert_eq!(load("rl_algorithm = \" MAREFORCE \"", &[]).unwrap().rl_algorithm, "mareinforce", "the alias");
    assert_eq!((c.use_separate_critic, c.critic_type.as_str(), c.value_loss_coef), (true, "v", 0.6));
    assert_eq!((c.value_clip_range, c.critic_learning_rate, c.critic_model_name.as_deref()), (Some(0.2), None, None));
    assert_eq!(load("critic_type = \" Q \"", &[]).unwrap().critic_type, "q");
}

#[test]
fn every_config_key_is_documented() {
    for name in ["Config", "TaskConfig", "RewardConfig", "AgentLora"] {
        let doc = super::reference::struct_doc(name);
        let keys: Vec<_> = doc.sections.iter().flat_map(|(_, k)| k).collect();
        assert!(keys.len() >= 4, "{name}: {} keys read", keys.len());
        let bare: Vec<&str> = keys.iter().filter(|k| k.doc.trim().is_empty()).map(|k| k.name.as_str()).collect();
        assert!(
            bare.is_empty(),
            "{name}: keys without a doc comment (docs/config.md would not explain them): {bare:?}"
        );
    }
    assert!(super::reference::struct_doc("Config").sections.iter().map(|(_, k)| k.len()).sum::<usize>() > 100);
}

/// `docs/config.md` is what the source says today; `PBRL_BLESS=1` rewrites it.
#[test]
fn config_reference_is_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config.md");
    let now = super::reference::markdown();
    if std::env::var_os("PBRL_BLESS").is_some() {
        std::fs::write(&path, &now).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == now,
        "docs/config.md is stale: regenerate it with `PBRL_BLESS=1 cargo test --lib config_reference`"
    );
}

/// The string keys' modes, as types, after the rules normalized them (aliases, case).
#[test]
fn modes_are_typed_when_the_config_loads() {
    let c = load("", &[]).unwrap();
    assert_eq!(c.modes, Modes::default(), "the defaults' modes are Modes::default()");
    let c = load(
        "rl_algorithm = \"MARLOO\"\ncollaboration_mode = \"centralized\"\nagents = [\"m\"]\ncritic_type = \"Q\"",
        &[],
    )
    .unwrap();
    assert_eq!(c.modes.marlhf, MarlhfBackend::PolicyGradient(AdvantageMode::Rloo));
    assert!(c.modes.centralized && c.modes.q_critic);
    let c = load("rl_algorithm = \"iac\"\nuse_separate_critic = false\npair_selection = \"all\"\npreference_pairs_per_sample = \"none\"", &[]).unwrap();
    assert_eq!(c.modes.marlhf, MarlhfBackend::Iac { separate: false });
    assert_eq!(c.modes.selection, PairSelection::All);
    let iterative = |text: &str| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        Config::load_iterative(&path, &[]).unwrap()
    };
    let c = iterative("comparator_policy = \"history\"\ncomparator_history_k = 2\nalgorithm = \"marlhf\"");
    assert_eq!(c.modes.comparator, ComparatorPolicy::History(2));
    assert_eq!(c.modes.selection, PairSelection::ComparatorReward);
    assert!(c.modes.marlhf_rounds && !c.modes.score_with_reward_model);
    let c = iterative(
        "comparator_policy = \"model\"\ncomparator_model_name = \"x\"\ncomparator_generation_mode = \"centralized\"",
    );
    assert_eq!(c.modes.comparator, ComparatorPolicy::Model(vec!["x".into(), "x".into()]));
    assert_eq!(c.modes.comparator_writer, Some(0));
}

/// `iterate`'s cross-field rule lives with the others: an API comparator cannot stand in for a
/// centralized actor (the config of another command does not use the comparator).
#[test]
fn an_api_comparator_needs_a_decentralized_team() {
    let text = "collaboration_mode = \"centralized\"\nagents = [\"m\"]\ncomparator_policy = \"api\"\n\
                comparator_api_url = \"http://localhost:1\"";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, text).unwrap();
    let e = Config::load_iterative(&path, &[]).unwrap_err().0;
    assert!(
        e.ends_with("comparator_policy = \"api\" with a centralized actor: choose a model-based comparator_policy"),
        "{e}"
    );
    assert!(load(text, &[]).is_ok());
}

/// `target_modules`: a string or a list, for all agents; or a list of those, one per agent.
#[test]
fn agent_lora_target_modules_take_a_string_or_a_list() {
    let targets = |toml: &str, i: usize| load(toml, &[]).unwrap().agent_lora.unwrap().shape_of(i).2;
    assert_eq!(targets("[agent_lora]\ntarget_modules = \"all-linear\"", 1).len(), 7);
    assert_eq!(targets("[agent_lora]\ntarget_modules = [\"q_proj\", \"v_proj\"]", 1), ["q_proj", "v_proj"]);
    let each = "[agent_lora]\ntarget_modules = [[\"q_proj\"], \"all-linear\"]";
    assert_eq!((targets(each, 0), targets(each, 1).len()), (vec!["q_proj".to_string()], 7));
    let e = load("[agent_lora]\ntarget_modules = 3", &[]).unwrap_err().to_string();
    assert!(e.contains("target_modules"), "{e}");
    let e = load("[agent_lora]\ntarget_modules = [[\"q_proj\"], [\"qproj\"]]", &[]).unwrap_err().to_string();
    assert!(e.contains("`qproj` is not one of"), "{e}");
}

/// `r`, `alpha`, `use_rslora`: one value, or one per agent (a list of another length is refused).
#[test]
fn agent_lora_shapes_per_agent() {
    let c = load("[agent_lora]\nr = [4, 16]\nalpha = 8.0\nuse_rslora = [false, true]", &[]).unwrap();
    let lora = c.agent_lora.unwrap();
    assert_eq!((lora.shape_of(0).0, lora.shape_of(0).1, lora.shape_of(0).3), (4, 8.0, false));
    assert_eq!((lora.shape_of(1).0, lora.shape_of(1).1, lora.shape_of(1).3), (16, 8.0, true));
    let e = load("[agent_lora]\nr = [4, 16, 8]", &[]).unwrap_err().to_string();
    assert!(e.contains("agent_lora.r has 3 entries but there are 2 actors"), "{e}");
    let e = load("[agent_lora]\nr = [4, 0]", &[]).unwrap_err().to_string();
    assert!(e.contains("agent_lora.r must be in [1, 1024]"), "{e}");
    let e = load("[agent_lora]\nalpha = [1.0, \"x\"]", &[]).unwrap_err().to_string();
    assert!(e.contains("agent_lora.alpha") && e.contains("expected f64"), "{e}");
    let c = load("", &["agent_lora.r=[8, 32]"]).unwrap();
    assert_eq!(c.agent_lora.unwrap().shape_of(1).0, 32);
}

/// `[agent_lora]` from the command line alone: the named keys, the rest of the table's defaults.
#[test]
fn agent_lora_can_be_set_by_overrides() {
    let c = load("", &["agent_lora.r=16", "agent_lora.alpha=32"]).unwrap();
    let lora = c.agent_lora.expect("the table is set");
    let (r, alpha, targets, _) = lora.shape_of(1);
    assert_eq!((r, alpha, lora.dropout, targets.len()), (16, 32.0, 0.0, 7), "all-linear by default");
    assert!(load("", &[]).unwrap().agent_lora.is_none());
}

/// Every bundled config loads and validates, as `pbrl` and `pbrl iterate` read it: a typo or a
/// key a change made invalid shows here, not first on a user's machine.
#[test]
fn every_bundled_config_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "toml"));
    assert!(files.len() >= 3, "the bundled configs: {files:?}");
    for file in files {
        Config::load(&file, &[]).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        Config::load_iterative(&file, &[]).unwrap_or_else(|e| panic!("{} (iterate): {e}", file.display()));
    }
}

/// The carry-over task (`configs/tips_guides.toml`) runs the quickstart's settings on other
/// prompts and roles: its resolved config differs from the quickstart's only in the run
/// directory and the `[task]` table, so a change to the quickstart's settings cannot leave the
/// carry-over check measuring older ones.
#[test]
fn the_carry_over_task_has_the_quickstarts_settings() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let resolved = |name: &str| -> toml::Table {
        let c = Config::load_iterative(&dir.join(name), &[]).unwrap();
        let mut t: toml::Table = c.to_toml().parse().unwrap();
        assert!(t.remove("run_dir").is_some() && t.remove("task").is_some(), "{name}");
        t
    };
    assert_eq!(resolved("tips_guides.toml"), resolved("quickstart.toml"));
}

/// `keep_best_tolerance` is read as a number of standard errors, an integer too; left at 0 it is
/// not written back, so the run fingerprints made before it existed are unchanged.
#[test]
fn keep_best_tolerance_is_a_number_of_standard_errors() {
    let base = "keep_best = true\neval_interval = 4\neval_num_samples = 8\n";
    assert_eq!(load(base, &["keep_best_tolerance=1"]).unwrap().keep_best_tolerance, 1.0);
    assert_eq!(load(base, &["keep_best_tolerance=0.5"]).unwrap().keep_best_tolerance, 0.5);
    let plain = load(base, &[]).unwrap();
    assert_eq!(plain.keep_best_tolerance, 0.0);
    assert!(!plain.to_toml().contains("keep_best_tolerance"));
    assert!(load(base, &["keep_best_tolerance=2"]).unwrap().to_toml().contains("keep_best_tolerance = 2"));
}

/// The multi-turn keys: what a stage that runs one turn refuses, and the `[transition]` table's
/// rules.
#[test]
fn multi_turn_keys_are_checked_and_single_turn_stages_refuse_them() {
    let debate = "agent_model = \"m\"\nnum_turns = 2\n[transition]\nkind = \"debate\"\n";
    let c = load(debate, &[]).unwrap();
    let turns = c.turns().unwrap();
    assert_eq!(turns.num_turns, 2);
    assert!(matches!(&turns.transition, TransitionSpec::Debate(t) if t[0] == DEFAULT_DEBATE_TEMPLATE));
    assert_eq!(turns.history_reward, HistoryReward::Last);
    assert!(c.single_turn("iterate").unwrap_err().0.contains("`pbrl iterate` runs single-turn discussions only"));
    assert!(c.reward_fit().unwrap_err().0.contains("`pbrl fit-rm` runs single-turn discussions only"));
    assert_eq!(c.madpo().unwrap().num_turns, 2, "MADPO trains on multi-turn histories");
    assert!(load(debate, &["rl_algorithm=\"iac\""]).unwrap().marlhf_turns().is_err());
    assert!(load("", &[]).unwrap().turns().is_none(), "one turn");
    for (text, msg) in [
        ("num_turns = 2\ndiscount = 0.9\n[transition]\n", "discount = 0.9: multi-turn returns are undiscounted"),
        ("history_reward = \"max\"", "history_reward must be \"last\" or \"sum\"."),
        ("rl_reward = \"oracle\"", "rl_reward must be \"reward_model\" or \"task\"."),
        ("[transition]\nkind = \"chat\"", "transition.kind = \"chat\": give \"debate\" or \"command\""),
        ("[transition]\nkind = \"command\"", "transition kind = \"command\" needs transition.command"),
        ("[transition]\ntemplate = [\"a\"]", "transition.template has 1 entries but there are 2 actors"),
        ("[transition]\ncommand = [\"x\"]", "transition.command and transition.env belong to kind = \"command\""),
        ("[transition]\ntimeout_s = 0.0", "transition.timeout_s must be a positive number"),
        ("early_termination_threshold = \"low\"", "give a number, or \"none\""),
    ] {
        let m = message(text, &[]);
        assert!(m.contains(msg), "{text}: {m}");
    }
    let m = message(&format!("{debate}[task]\nformatters = [\"{{topic}}\"]\n"), &[]);
    assert!(m.contains("has no {prompt}, so later turns would not show it"), "{m}");
    let none = load(&format!("early_termination_threshold = \"none\"\n{debate}"), &[]).unwrap();
    assert_eq!(none.early_termination_threshold, Some(Threshold::Never));
    let cross = load("joint_mode = \"cross\"", &[]).unwrap();
    assert!(cross.aligned("collect").unwrap_err().0.contains("cross joint actions"));
}
