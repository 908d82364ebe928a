//! The config file watcher: an edit is applied only once the file has held the same
//! text for [`SETTLE`], so that a file caught mid-write (by an editor or `cp`),
//! which may well parse while lacking its last rules, is never applied. A renewed
//! TLS certificate or key, or an issuer's JWKS file replaced (its keys rotated),
//! counts as an edit of the config that names it.

use std::{
    fmt::Write as _,
    path::Path,
    time::{Duration, Instant, UNIX_EPOCH},
};

use crate::config::Config;

/// How often the config file is read.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(500);
/// How long an edit must stay unchanged before it is applied.
pub const SETTLE: Duration = Duration::from_secs(2);

/// The text last seen differing from the applied one, and since when.
#[derive(Debug, Default)]
pub struct Settle {
    seen: Option<(String, Instant)>,
}

impl Settle {
    /// Takes the file's text read at `now`; the text to apply once it has settled.
    pub fn observe(&mut self, current: Option<String>, applied: Option<&str>, now: Instant) -> Option<String> {
        let Some(current) = current.filter(|text| Some(text.as_str()) != applied) else {
            self.seen = None;
            return None;
        };
        match &self.seen {
            Some((text, since)) if *text == current => {
                if now.duration_since(*since) < SETTLE {
                    return None;
                }
                self.seen = None;
                Some(current)
            }
            _ => {
                self.seen = Some((current, now));
                None
            }
        }
    }
}

/// What the watcher compares: a first line stamping the certificate and JWKS files
/// `config` names (size and modification time of each), then the config's `text`.
#[must_use]
pub fn state(text: &str, config: &Config) -> String {
    let tls = config.proxy.as_ref().and_then(|proxy| proxy.tls.as_ref());
    let jwt = config.proxy.as_ref().and_then(|proxy| proxy.jwt.as_ref());
    let files = tls
        .into_iter()
        .flat_map(|tls| [&tls.cert, &tls.key].into_iter().chain(tls.sni.iter().flat_map(|sni| [&sni.cert, &sni.key])))
        .chain(jwt.into_iter().flat_map(|jwt| jwt.issuers.iter().map(|issuer| &issuer.jwks_file)));
    let mut stamp = String::new();
    for file in files {
        let _ = write!(stamp, "{:?}={:?};", file, file_stamp(file));
    }
    format!("{stamp}\n{text}")
}

/// The config text of a [`state`].
#[must_use]
pub fn text_of(state: &str) -> &str {
    state.split_once('\n').map_or(state, |(_, text)| text)
}

fn file_stamp(path: &Path) -> Option<(u64, u128)> {
    let metadata = std::fs::metadata(path).ok()?;
    let modified = metadata.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some((metadata.len(), modified.as_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_certificate_changes_the_state_and_the_text_comes_back_whole() {
        let dir = std::env::temp_dir().join(format!("limiter-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let cert = dir.join("cert.pem");
        std::fs::write(&cert, "one").expect("cert");
        let text = format!(
            "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:1\"\n[proxy.tls]\ncert = {cert:?}\nkey = {:?}\n",
            dir.join("key.pem")
        );
        let config = Config::parse(&text, Path::new("t.toml")).expect("config");
        let before = state(&text, &config);
        assert_eq!(text_of(&before), text);
        std::fs::write(&cert, "renewed").expect("cert");
        assert_ne!(state(&text, &config), before);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_rotated_jwks_changes_the_state() {
        let dir = std::env::temp_dir().join(format!("limiter-watch-jwks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let jwks = dir.join("jwks.json");
        std::fs::write(&jwks, r#"{"keys": []}"#).expect("jwks");
        let text = format!(
            "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:1\"\n[proxy.jwt]\n\
             issuers = [{{ iss = \"https://id.example.com\", jwks_file = {jwks:?} }}]\n"
        );
        let config = Config::parse(&text, Path::new("t.toml")).expect("config");
        let before = state(&text, &config);
        std::fs::write(&jwks, r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "rotated"}]}"#).expect("jwks");
        assert_ne!(state(&text, &config), before, "the issuer rotated its keys");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_edit_is_applied_only_after_it_held_still_for_the_settle_interval() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut settle = Settle::default();
        let applied = Some("old");
        assert_eq!(settle.observe(Some("old".into()), applied, at(0)), None);
        assert_eq!(settle.observe(Some("half".into()), applied, at(500)), None);
        assert_eq!(settle.observe(Some("half".into()), applied, at(2_000)), None, "still within the interval");
        // The writer goes on: the clock starts again.
        assert_eq!(settle.observe(Some("half, then the rest".into()), applied, at(2_400)), None);
        assert_eq!(settle.observe(Some("half, then the rest".into()), applied, at(4_399)), None);
        assert_eq!(
            settle.observe(Some("half, then the rest".into()), applied, at(4_400)),
            Some("half, then the rest".into())
        );
        // Back to the applied text (or unreadable): nothing pending.
        assert_eq!(settle.observe(Some("new".into()), applied, at(5_000)), None);
        assert_eq!(settle.observe(Some("old".into()), applied, at(5_500)), None);
        assert_eq!(settle.observe(Some("new".into()), applied, at(8_000)), None, "seen anew");
        assert_eq!(settle.observe(None, applied, at(8_500)), None);
        assert_eq!(settle.observe(Some("new".into()), applied, at(11_000)), None, "seen anew");
    }
}
