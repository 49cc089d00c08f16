//! `app`: the binary edge. Parses the command line, validates the configuration and hands
//! over to the library's bootstrap ([`vramfork::master::bootstrap`]), which probes the
//! machine, plans, and then prints the plan (`app plan`), becomes the single serving worker
//! (development) or runs the master (`--production`). Exit statuses:
//! [`vramfork::master::exit`].

use std::process::ExitCode;

use clap::FromArgMatches;

use vramfork::logging;
use vramfork::master::bootstrap;
use vramfork::master::cli::{Cli, Command};
use vramfork::master::config::{self, Config};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // TorchServe's options, typed out of habit: named with what does the same here.
    if let Some(e) = vramfork::torchserve::cli::habit(args.get(1..).unwrap_or_default()) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    // The command line with each option's default rendered into its help.
    let cli = Cli::from_arg_matches(&config::command().get_matches()).unwrap_or_else(|e| e.exit());
    // `app ledger` reads the host's ledger only: no metadata, no configuration.
    if let Some(Command::Ledger { json }) = cli.command {
        let code = vramfork::master::host::view::run(cli.ledger.as_deref(), json);
        return ExitCode::from(code as u8);
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.to_path_buf()));
    let env = |k: &str| std::env::var(k).ok();
    let code = match Config::from_cli(cli, &env, &args, exe_dir.as_deref()) {
        Ok(cfg) => bootstrap::run(cfg),
        Err(e) => bootstrap::fail(e),
    };
    // The last lines (why it exits), for a bounded time: a stalled reader does not hold it.
    logging::flush();
    ExitCode::from(code as u8)
}
