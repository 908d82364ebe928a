//! `limiter detach`: remove the XDP program, its links and every pin.

use std::{path::Path, process::ExitCode};

use super::CliError;
use crate::{
    agent::{Request, Response, admin},
    config::Config,
};

pub fn run(path: &Path) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
    // A running agent holds the links open: ask it to let go and stop first.
    if let Ok(Response::Detaching) =
        admin::ask_blocking(&config.agent.admin_socket, &Request::Detach, super::AGENT_TIMEOUT)
    {
        println!("agent detached and stopping");
        wait_until_gone(&config.agent.admin_socket);
    }
    let removed = crate::xdp::detach_all(&config.agent.pin_dir)?;
    for attachment in &removed {
        println!("detached {} ({})", attachment.interface, attachment.mode);
    }
    println!("removed pins under {}", config.agent.pin_dir.display());
    Ok(ExitCode::SUCCESS)
}

/// The agent removes its socket as its last step.
fn wait_until_gone(socket: &Path) {
    let deadline = std::time::Instant::now() + super::AGENT_TIMEOUT;
    while socket.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
