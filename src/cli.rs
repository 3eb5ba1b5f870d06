//! The command line (spec §1). Only subcommands that work are declared.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "pbrl", version, about = "Train a team of LLM agents from preferences between their joint responses")]
pub struct Cli {
    /// Threads for candle and rayon (default: PBRL_THREADS, else the physical cores).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sample candidates from the current agents, score them with the oracle, build preference
    /// pairs, write the next round file <replay dir>/iteration_NNNN.json.
    Collect(CollectArgs),
    /// Train the agents with MADPO on the stored preference rounds.
    TrainMadpo(TrainArgs),
    /// Fit a joint reward model to the stored preference rounds (Bradley–Terry), saved in
    /// <run_dir>/reward_model.
    FitRm(TrainArgs),
    /// Train the agents with RL on the fitted reward model (MAGRPO family, iac, maac), save them
    /// to <run_dir>/agents.
    TrainMarlhf(TrainArgs),
    /// Iterative MADPO or MARLHF: num_iterations rounds of comparing the current team with a
    /// comparator (current, current_copy, model, history, api) and training on the replay selection.
    Iterate(IterateArgs),
    /// Sample from the agents, score with the task reward only, write a report.
    Eval(EvalArgs),
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Which team to evaluate: `current` (the run's trained agents, else the base models),
    /// `base` (the configured models), or a directory holding a saved team (a run's agents/).
    #[arg(long, value_name = "current|base|DIR", default_value = "current")]
    pub team: String,
    /// Print every joint response (a row per item and sample), not the first few.
    #[arg(long)]
    pub table: bool,
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Continue from the newest checkpoint (train-madpo: <run_dir>/checkpoints; fit-rm:
    /// <run_dir>/reward_model_training/checkpoints; train-marlhf:
    /// <run_dir>/marlhf_training/checkpoints).
    #[arg(long)]
    pub resume: bool,
}

#[derive(Debug, Args)]
pub struct IterateArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Continue after the last finished round (<run_dir>/iterate/round_NNNN.json); a round cut
    /// short is repeated.
    #[arg(long)]
    pub resume: bool,
}

#[derive(Debug, Args)]
pub struct CollectArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Write round N instead of the next free round number.
    #[arg(long, value_name = "N")]
    pub round: Option<u32>,
    /// Replace the round file if it exists.
    #[arg(long)]
    pub force: bool,
}

/// What every subcommand takes.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// The TOML config file.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Override a config key: KEY=VALUE (dotted for tables: task.eval_file=...). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Overrides may also be given bare: `pbrl eval --config c.toml max_new_tokens=32`.
    #[arg(value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// The run directory (overrides `run_dir`).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Print the resolved config (all defaults filled in) and exit.
    #[arg(long)]
    pub print_config: bool,
}
