//! `limiter upgrade`: ask the running agent to start the binary on disk on its
//! sockets, then drain and exit; print which process serves now, or why the new one
//! could not start (the old one then serves on).

use std::{path::Path, process::ExitCode};

use super::CliError;
use crate::agent::{READY_TIMEOUT, Request, Response, admin};

pub fn run(path: &Path) -> Result<ExitCode, CliError> {
    // The new binary reads the file itself: here only the socket's address is needed.
    let socket = crate::config::admin_socket_of(path);
    // The agent answers once the new one is ready, or has failed, or is too late.
    let timeout = READY_TIMEOUT + super::AGENT_TIMEOUT;
    match admin::ask_blocking(&socket, &Request::Upgrade, timeout)? {
        Response::Upgraded { old, new } => {
            println!("upgraded: pid {new} serves; pid {old} drains and exits");
            Ok(ExitCode::SUCCESS)
        }
        Response::Rejected { error } => {
            eprintln!("upgrade failed: {error}");
            Ok(ExitCode::FAILURE)
        }
        other => Err(CliError::UnexpectedAnswer(format!("{other:?}"))),
    }
}
