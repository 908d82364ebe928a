//! The descriptors a process was started with, as systemd's socket activation passes
//! them (`sd_listen_fds_with_names(3)`): `LISTEN_FDS=N` open descriptors from 3 on,
//! `LISTEN_FDNAMES` their names separated by `:`, and `LISTEN_PID` the process they
//! are meant for. `limiter upgrade` hands its listening sockets to the new binary the
//! same way, so that one parser serves both.
//!
//! Only the text is read here; whether a descriptor is open, and what it is, the
//! agent finds out when it takes it.

/// The first descriptor passed (after stdin, stdout and stderr).
pub const FIRST_FD: i32 = 3;

/// More descriptors than anyone passes: a larger count is a mistake, not a request
/// to take over every descriptor the process has.
pub const MAX_FDS: usize = 64;

/// The longest name systemd accepts (`FileDescriptorName=`).
pub const MAX_NAME_BYTES: usize = 255;

/// The name systemd gives a descriptor when `LISTEN_FDNAMES` is absent.
pub const UNNAMED: &str = "unknown";

/// The three variables, as read from the environment (`None`: unset).
#[derive(Clone, Copy, Debug, Default)]
pub struct ListenEnv<'a> {
    pub listen_pid: Option<&'a str>,
    pub listen_fds: Option<&'a str>,
    pub listen_fdnames: Option<&'a str>,
}

/// One descriptor passed, with its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub fd: i32,
}

/// Why the variables cannot be read; each names the variable.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InheritedError {
    #[error("LISTEN_FDS: `{0}` is not a count of descriptors from 0 to {MAX_FDS}")]
    Count(String),
    #[error("LISTEN_PID: `{0}` is not a process id")]
    Pid(String),
    #[error("LISTEN_FDNAMES: {names} names for LISTEN_FDS={fds} descriptors")]
    Names { names: usize, fds: usize },
    #[error("LISTEN_FDNAMES: `{0}` is not a name (1 to {MAX_NAME_BYTES} printable ASCII characters)")]
    Name(String),
    #[error("LISTEN_FDNAMES: `{0}` is named twice")]
    Twice(String),
}

/// The descriptors passed to process `own_pid`, in order from [`FIRST_FD`]. Empty when
/// `LISTEN_FDS` is unset, or when `LISTEN_PID` names another process (the variables
/// were inherited from a parent they were meant for). `LISTEN_PID` unset is accepted:
/// `limiter upgrade` cannot know its child's pid before the child runs.
pub fn parse(env: ListenEnv<'_>, own_pid: u32) -> Result<Vec<Named>, InheritedError> {
    let Some(count) = env.listen_fds else { return Ok(Vec::new()) };
    if let Some(pid) = env.listen_pid {
        let pid: u32 = pid.trim().parse().map_err(|_| InheritedError::Pid(clip(pid)))?;
        if pid != own_pid {
            return Ok(Vec::new());
        }
    }
    let fds = count
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|n| *n <= MAX_FDS)
        .ok_or_else(|| InheritedError::Count(clip(count)))?;
    let names: Vec<&str> = match env.listen_fdnames {
        Some(names) if fds > 0 => names.split(':').collect(),
        Some(names) if !names.is_empty() => return Err(InheritedError::Names { names: 1, fds }),
        _ => vec![UNNAMED; fds],
    };
    if names.len() != fds {
        return Err(InheritedError::Names { names: names.len(), fds });
    }
    let mut passed: Vec<Named> = Vec::with_capacity(fds);
    for (fd, name) in (FIRST_FD..).zip(names) {
        if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(InheritedError::Name(clip(name)));
        }
        // "unknown" is systemd's name for every unnamed descriptor, so it may repeat.
        if name != UNNAMED && passed.iter().any(|p| p.name == name) {
            return Err(InheritedError::Twice(name.to_owned()));
        }
        passed.push(Named { name: name.to_owned(), fd });
    }
    Ok(passed)
}

/// `LISTEN_FDNAMES` for `names`, passed from [`FIRST_FD`] on.
#[must_use]
pub fn names_value(names: &[&str]) -> String {
    names.join(":")
}

/// A value quoted in an error, cut short: the environment is not ours to echo whole.
fn clip(value: &str) -> String {
    value.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pid: Option<&'a str>, fds: Option<&'a str>, names: Option<&'a str>) -> ListenEnv<'a> {
        ListenEnv { listen_pid: pid, listen_fds: fds, listen_fdnames: names }
    }

    fn named(name: &str, fd: i32) -> Named {
        Named { name: name.to_owned(), fd }
    }

    #[test]
    fn systemd_names_descriptors_from_three() {
        let passed = parse(env(Some("42"), Some("2"), Some("proxy:metrics")), 42).expect("valid");
        assert_eq!(passed, vec![named("proxy", 3), named("metrics", 4)]);
    }

    #[test]
    fn without_names_each_is_unknown() {
        let passed = parse(env(Some("42"), Some("2"), None), 42).expect("valid");
        assert_eq!(passed, vec![named(UNNAMED, 3), named(UNNAMED, 4)]);
    }

    #[test]
    fn another_process_s_variables_pass_nothing() {
        assert_eq!(parse(env(Some("41"), Some("1"), Some("proxy")), 42), Ok(Vec::new()));
        assert_eq!(parse(env(None, None, Some("proxy")), 42), Ok(Vec::new()));
    }

    #[test]
    fn an_upgrade_passes_no_pid() {
        let passed = parse(env(None, Some("1"), Some("proxy")), 42).expect("valid");
        assert_eq!(passed, vec![named("proxy", 3)]);
    }

    #[test]
    fn mistakes_name_their_variable() {
        assert_eq!(parse(env(None, Some("x"), None), 1), Err(InheritedError::Count("x".to_owned())));
        assert_eq!(parse(env(None, Some("65"), None), 1), Err(InheritedError::Count("65".to_owned())));
        assert_eq!(parse(env(Some("-1"), Some("1"), None), 1), Err(InheritedError::Pid("-1".to_owned())));
        assert_eq!(parse(env(None, Some("2"), Some("proxy")), 1), Err(InheritedError::Names { names: 1, fds: 2 }));
        assert_eq!(parse(env(None, Some("0"), Some("proxy")), 1), Err(InheritedError::Names { names: 1, fds: 0 }));
        assert_eq!(parse(env(None, Some("2"), Some("a:")), 1), Err(InheritedError::Name(String::new())));
        assert_eq!(parse(env(None, Some("1"), Some("a b")), 1), Err(InheritedError::Name("a b".to_owned())));
        assert_eq!(parse(env(None, Some("2"), Some("a:a")), 1), Err(InheritedError::Twice("a".to_owned())));
        let long = "x".repeat(1000);
        let Err(InheritedError::Name(quoted)) = parse(env(None, Some("1"), Some(&long)), 1) else { panic!() };
        assert_eq!(quoted.len(), 40, "an error quotes 40 characters at most");
    }

    #[test]
    fn none_passed_is_empty() {
        assert_eq!(parse(env(None, Some("0"), None), 1), Ok(Vec::new()));
        assert_eq!(parse(env(None, Some("0"), Some("")), 1), Ok(Vec::new()));
    }

    #[test]
    fn names_round_trip() {
        let value = names_value(&["proxy", "admin", "ready"]);
        let passed = parse(env(None, Some("3"), Some(&value)), 1).expect("valid");
        assert_eq!(passed.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["proxy", "admin", "ready"]);
    }
}
