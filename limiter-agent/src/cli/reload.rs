//! `limiter reload`: ask the running agent to reload, print what changed.

use std::{path::Path, process::ExitCode};

use super::CliError;
use crate::agent::{Request, Response, admin};

pub fn run(path: &Path) -> Result<ExitCode, CliError> {
    // The file may be the broken config being reloaded: the agent judges it (and
    // logs the refusal); here only the socket's address is needed.
    let socket = crate::config::admin_socket_of(path);
    let request = Request::Reload { config: Some(std::fs::canonicalize(path)?) };
    match admin::ask_blocking(&socket, &request, super::AGENT_TIMEOUT)? {
        Response::Reloaded { changes } => {
            if changes.is_empty() {
                println!("no changes");
            }
            for change in changes {
                println!("{change}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Response::Rejected { error } => {
            eprintln!("reload rejected, the running config stays in force:\n{error}");
            Ok(ExitCode::FAILURE)
        }
        other => Err(CliError::UnexpectedAnswer(format!("{other:?}"))),
    }
}
