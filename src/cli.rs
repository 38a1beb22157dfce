//! The command line: `sluice serve`, `sluice check-config` and `sluice counters get|reset|refund` (the
//! admin API's client, `admin_client.rs`). The edge of the program, so errors
//! are `anyhow` here and exit codes are decided here. With no subcommand the binary serves, as
//! upstream's `/bin/ratelimit` does (Envoy Gateway runs it with no arguments).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::settings::{Env, Settings};
use sluice::config;

#[derive(Parser, Debug)]
#[command(
    name = "sluice",
    version,
    about = "An Envoy-compatible rate limit service"
)]
struct Cli {
    /// Nothing: `serve` with every setting from the environment.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the service. Every setting has an environment variable (upstream's names); flags win.
    Serve(ServeArgs),
    /// Validate a config directory and print the compiled limits. Exits 1 on errors.
    CheckConfig {
        /// Config directory: every file in it is loaded (default: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY).
        dir: Option<PathBuf>,
    },
    /// Read or reset the counters of a descriptor through a running Sluice's admin API (its
    /// debug port, with ADMIN_API_TOKEN). Prints the server's JSON; exits 1 when refused.
    Counters {
        #[command(subcommand)]
        action: CountersAction,
    },
}

#[derive(Subcommand, Debug)]
enum CountersAction {
    /// Show every limit the descriptor is counted under, with what is used and remaining.
    Get(CountersArgs),
    /// Reset those counters; prints them as they were just before.
    Reset(CountersArgs),
    /// Give back up to --hits hits to each of those counters (fixed_window, token_bucket, gcra,
    /// leaky_bucket); prints them as they are after.
    Refund {
        #[command(flatten)]
        args: CountersArgs,
        /// The hits to give back, at least 1.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        hits: u64,
    },
}

#[derive(clap::Args, Debug)]
struct CountersArgs {
    /// The debug listener's URL (DEBUG_HOST:DEBUG_PORT).
    #[arg(long, default_value = "http://127.0.0.1:6070")]
    addr: String,
    /// The domain, as the configuration names it.
    #[arg(long)]
    domain: String,
    /// The descriptor: key=value[,key2=value2...]; write a ',' '=' or '\' inside a key or
    /// value as \, \= or \\.
    #[arg(long)]
    descriptor: String,
    /// The admin API's bearer token.
    #[arg(long, env = "ADMIN_API_TOKEN", hide_env_values = true)]
    token: String,
    /// How long to wait for the answer, in seconds.
    #[arg(long, default_value_t = 10)]
    timeout_secs: u64,
}

#[derive(clap::Args, Debug, Default)]
struct ServeArgs {
    /// Config directory: every file in it is loaded, whatever its name ends with.
    #[arg(long)]
    config_dir: Option<PathBuf>,
    /// Use Redis at this URL (redis://host:port, rediss://…, unix:///path) instead of BACKEND_TYPE.
    #[arg(long)]
    redis_url: Option<String>,
    /// gRPC listen address (GRPC_HOST:GRPC_PORT).
    #[arg(long)]
    grpc_addr: Option<std::net::SocketAddr>,
    /// HTTP listen address (HOST:PORT).
    #[arg(long)]
    http_addr: Option<std::net::SocketAddr>,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => serve(ServeArgs::default()),
        Some(Command::Serve(args)) => serve(args),
        Some(Command::CheckConfig { dir }) => check_config(dir),
        Some(Command::Counters { action }) => counters(action),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("sluice: {}", describe(&error));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each once: most of Sluice's errors already quote their cause in
/// their own message (`cannot listen on …: <cause>`), so a cause whose text is already shown is
/// not repeated (anyhow's `{:#}` would print it twice).
fn describe(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // `--redis-url` selects Redis and its address; the other Redis settings still come from
    // the environment.
    let redis_url = args.redis_url;
    let mut settings = Settings::from_vars(&Env(|name| match (name, &redis_url) {
        ("BACKEND_TYPE", Some(_)) => Some("redis".into()),
        ("REDIS_URL", Some(url)) => Some(url.clone()),
        _ => std::env::var(name).ok(),
    }))
    .context("invalid environment")?;
    if let Some(dir) = args.config_dir {
        settings.config_dir = dir;
    }
    if let Some(addr) = args.grpc_addr {
        settings.grpc_addr = addr;
    }
    if let Some(addr) = args.http_addr {
        settings.http_addr = addr;
    }
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    // Inside the runtime: the trace exporter's gRPC channel lives on it.
    let _telemetry = runtime
        .block_on(async { crate::telemetry::init(&settings.log, settings.trace.as_ref()) })?;
    runtime.block_on(crate::app::serve(
        settings,
        crate::server::shutdown_signal(),
    ))?;
    Ok(ExitCode::SUCCESS)
}

fn counters(action: CountersAction) -> anyhow::Result<ExitCode> {
    use crate::admin_client::Action;
    let (action, args) = match action {
        CountersAction::Get(args) => (Action::Get, args),
        CountersAction::Reset(args) => (Action::Reset, args),
        CountersAction::Refund { args, hits } => (Action::Refund(hits), args),
    };
    let call = crate::admin_client::CountersCall {
        action,
        addr: args.addr,
        domain: args.domain,
        descriptor: args.descriptor,
        token: args.token,
        timeout: std::time::Duration::from_secs(args.timeout_secs),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let body = runtime.block_on(crate::admin_client::run(&call))?;
    println!("{body}");
    Ok(ExitCode::SUCCESS)
}

fn check_config(dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let settings = Settings::from_env().context("invalid environment")?;
    for notice in &settings.notices {
        eprintln!("warning: {notice}");
    }
    let dir = dir.unwrap_or(settings.config_dir);
    let config = match config::load_dir(&dir, &settings.load) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!("{}: {} error(s)", dir.display(), errors.0.len());
            return Ok(ExitCode::FAILURE);
        }
    };
    for warning in &config.warnings {
        eprintln!("warning: {warning}");
    }
    for file in &config.files {
        println!("loaded {}", file.display());
    }
    let limits = config.limits();
    for limit in &limits {
        println!("{limit}");
    }
    println!(
        "{}: OK, {} file(s), {} domain(s), {} limit(s)",
        dir.display(),
        config.files.len(),
        config.domain_names().count(),
        limits.len()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_shown_once() {
        let bind = crate::server::ServeError::Bind {
            addr: "127.0.0.1:1".parse().unwrap(),
            source: std::io::Error::other("address in use"),
        };
        assert_eq!(
            describe(&anyhow::Error::from(bind)),
            "cannot listen on 127.0.0.1:1: address in use"
        );
        let wrapped = anyhow::Error::from(std::io::Error::other("no such variable"))
            .context("invalid environment");
        assert_eq!(describe(&wrapped), "invalid environment: no such variable");
    }
}
