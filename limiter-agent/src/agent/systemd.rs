//! Telling systemd (`Type=notify`) that the agent serves, and which process is the
//! agent: after `limiter upgrade` the new agent is the service's main process, so
//! that systemd neither kills it when the old one exits nor stops tracking it.

/// Sends `READY=1` and this process's pid as `MAINPID` to `$NOTIFY_SOCKET`, if
/// systemd set it (the unit needs `NotifyAccess=all`: the new agent of an upgrade
/// is not the main process when it sends this).
pub(super) fn notify_ready() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let message = format!("READY=1\nMAINPID={}\n", std::process::id());
    if let Err(error) = send(&path, message.as_bytes()) {
        tracing::warn!(%error, "cannot tell systemd the agent is ready");
    }
}

fn send(path: &std::ffi::OsStr, message: &[u8]) -> std::io::Result<()> {
    use std::os::{linux::net::SocketAddrExt as _, unix::ffi::OsStrExt as _};
    let socket = std::os::unix::net::UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    // `@name` is an abstract socket.
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => std::os::unix::net::SocketAddr::from_abstract_name(name)?,
        None => std::os::unix::net::SocketAddr::from_pathname(path)?,
    };
    socket.send_to_addr(message, &addr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_message_reaches_a_path_socket() {
        let dir = std::env::temp_dir().join(limiter_lab::support::unique("limiter-notify"));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("notify.sock");
        let listener = std::os::unix::net::UnixDatagram::bind(&path).expect("bind");
        super::send(path.as_os_str(), b"READY=1\n").expect("send");
        let mut got = [0; 64];
        let n = listener.recv(&mut got).expect("recv");
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert_eq!(&got[..n], b"READY=1\n");
    }
}
