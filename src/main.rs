//! pbrl's entry point: parse the command line, load the config, set up logging and threads,
//! run the stage. Errors print as one line and exit with code 2.
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use pbrl::cli::{Cli, Command, CommonArgs};
use pbrl::config::{Config, Override};
use pbrl::run::{RunDir, RunLock};
use pbrl::team::Members;

fn main() -> ExitCode {
    // candle attaches a captured backtrace to its errors when RUST_BACKTRACE is set; error
    // messages stay one line (panics still honour RUST_BACKTRACE).
    std::env::set_var("RUST_LIB_BACKTRACE", "0");
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let threads = match pbrl::device::requested_threads(cli.threads) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    pbrl::device::init_threads(threads);
    // A bad PBRL_GEMM is a user error up front, not inside the first matrix product.
    match pbrl_model::gemm::kernel_choice() {
        Ok(choice) => tracing::debug!("matrix kernels: {}", choice.describe()),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes, no backtrace.
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::from(2)
        }
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("pbrl={default},warn")));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
}

/// Load the config with its overrides and take the run directory's lock (every command writes
/// there); `None` when only --print-config was asked.
fn load_config(args: &CommonArgs, command: &str) -> Result<Option<(Config, RunDir, RunLock)>> {
    let overrides =
        args.set.iter().chain(args.overrides.iter()).map(|s| Override::parse(s)).collect::<Result<Vec<_>, _>>()?;
    // `iterate` takes the reference's iterative defaults for what the config leaves unset.
    let mut cfg = if command == "iterate" {
        Config::load_iterative(&args.config, &overrides)?
    } else {
        Config::load(&args.config, &overrides)?
    };
    if let Some(d) = &args.run_dir {
        cfg.run_dir = d.clone();
    }
    if args.print_config {
        print!("{}", cfg.to_toml());
        return Ok(None);
    }
    let run_dir = RunDir::with_replay(&cfg.run_dir, cfg.preference_replay_dir.clone());
    let lock = RunLock::acquire(&run_dir, command)?;
    // Temporary files of killed commands (this one holds the lock, so none is being written).
    for dir in [run_dir.root.clone(), run_dir.replay().to_path_buf()] {
        for p in pbrl::run::atomic::sweep_stale(&dir)? {
            tracing::warn!("removed {}, left by an interrupted command", p.display());
        }
    }
    run_dir.write_config(&cfg.to_toml())?;
    Ok(Some((cfg, run_dir, lock)))
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Collect(args) => {
            let Some((cfg, run_dir, _lock)) = load_config(&args.common, "collect")? else { return Ok(()) };
            let opts = pbrl::stages::collect::CollectOptions { round: args.round, force: args.force };
            pbrl::stages::collect::run(&cfg, &run_dir, &opts)?;
        }
        Command::TrainMadpo(args) => {
            let Some((cfg, run_dir, _lock)) = load_config(&args.common, "train-madpo")? else { return Ok(()) };
            let opts = pbrl::train::madpo::TrainOptions { resume: args.resume };
            pbrl::stages::train_madpo::run(&cfg, &run_dir, &opts)?;
        }
        Command::FitRm(args) => {
            let Some((cfg, run_dir, _lock)) = load_config(&args.common, "fit-rm")? else { return Ok(()) };
            pbrl::stages::fit_rm::run(&cfg, &run_dir, &pbrl::train::reward_fit::FitOptions { resume: args.resume })?;
        }
        Command::TrainMarlhf(args) => {
            let Some((cfg, run_dir, _lock)) = load_config(&args.common, "train-marlhf")? else { return Ok(()) };
            let opts = pbrl::train::marlhf::TrainOptions { resume: args.resume };
            pbrl::stages::train_marlhf::run(&cfg, &run_dir, &opts)?;
        }
        Command::Iterate(args) => {
            let Some((cfg, run_dir, _lock)) = load_config(&args.common, "iterate")? else { return Ok(()) };
            pbrl::stages::iterate::run(&cfg, &run_dir, &pbrl::stages::iterate::IterateOptions { resume: args.resume })?;
        }
        Command::Eval(args) => {
            let Some((cfg, run_dir, _lock)) = load_config(&args.common, "eval")? else { return Ok(()) };
            let members = match args.team.as_str() {
                "current" => Members::Current,
                "base" => Members::Base,
                dir => Members::Saved(dir.into()),
            };
            pbrl::stages::eval::run(&cfg, &run_dir, &members, args.table)?;
        }
    }
    Ok(())
}
