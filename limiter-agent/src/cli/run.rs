//! `limiter run`: the agent in the foreground.

use std::{path::Path, process::ExitCode};

use super::CliError;
use crate::{
    agent::{AgentError, Inherited, LoadedConfig},
    config::agent::LogFormat,
};

pub fn run(path: &Path) -> Result<ExitCode, CliError> {
    // First: the descriptors an upgrade or systemd passed are taken before anything
    // else can open one.
    let mut inherited = Inherited::from_env().map_err(AgentError::from)?;
    let ready = inherited.ready();
    let loaded = match LoadedConfig::read(path) {
        Ok(loaded) => loaded,
        Err(error) => {
            eprintln!("{error}");
            // The upgrading agent serves on and says why.
            if let Some(ready) = ready {
                ready.failed(&error);
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    init_logging(loaded.config.agent.log_format);
    for warning in loaded.secrets.warnings() {
        tracing::warn!("{warning}");
    }
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(crate::agent::run(path.to_owned(), loaded, inherited, ready))?;
    Ok(ExitCode::SUCCESS)
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LIMITER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(colour).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
