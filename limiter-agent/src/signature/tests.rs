#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use std::io::Write as _;
use std::process::{Command, Stdio};

/// Hex SHA-256 of the empty string (FIPS 180-2 example, `sha256sum /dev/null`).
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Runs `openssl dgst -sha256 [extra]` over `input`; returns the hex digest.
fn openssl_dgst(extra: &[&str], input: &[u8]) -> String {
    let mut child = Command::new("openssl")
        .args(["dgst", "-sha256", "-r"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl must be installed for the known-answer tests");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl failed");
    // `-r` prints "HEX *stdin".
    String::from_utf8(out.stdout).unwrap().split(' ').next().unwrap().to_owned()
}

fn openssl_sha256(data: &[u8]) -> String {
    openssl_dgst(&[], data)
}

mod body {
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http_body::{Body, Frame};
    use http_body_util::{Empty, Full};

    use super::{EMPTY_SHA256, openssl_sha256};
    use crate::signature::{BodyError, read_body_hashed};

    /// A chunked body without a size hint, counting the frames it hands out.
    struct Chunked {
        frames: VecDeque<Result<Frame<Bytes>, std::io::Error>>,
        polled: Arc<AtomicUsize>,
    }

    impl Chunked {
        fn new(chunks: &[&[u8]]) -> (Self, Arc<AtomicUsize>) {
            let polled = Arc::new(AtomicUsize::new(0));
            let frames = chunks.iter().map(|c| Ok(Frame::data(Bytes::copy_from_slice(c)))).collect();
            (Self { frames, polled: Arc::clone(&polled) }, polled)
        }
    }

    impl Body for Chunked {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            let frame = self.frames.pop_front();
            if frame.is_some() {
                self.polled.fetch_add(1, Ordering::Relaxed);
            }
            Poll::Ready(frame)
        }
    }

    #[tokio::test]
    async fn exact_bytes_and_hash() {
        let chunks: &[&[u8]] = &[b"hello ", b"", b"wor", b"ld\x00\xff"];
        let (body, _) = Chunked::new(chunks);
        let (bytes, digest) = read_body_hashed(body, 13).await.unwrap();
        assert_eq!(&bytes[..], b"hello world\x00\xff");
        assert_eq!(hex::encode(digest), openssl_sha256(b"hello world\x00\xff"));
    }

    #[tokio::test]
    async fn too_large_at_max_plus_one() {
        let chunks: &[&[u8]] = &[b"aaaa", b"bbbb", b"c", b"dddd", b"eeee"];
        let (body, polled) = Chunked::new(chunks);
        let err = read_body_hashed(body, 8).await.unwrap_err();
        assert!(matches!(err, BodyError::TooLarge { limit: 8 }));
        // Stopped at the frame that crossed the bound, not after draining the stream.
        assert_eq!(polled.load(Ordering::Relaxed), 3);
        let (body, _) = Chunked::new(&chunks[..3]);
        assert!(matches!(read_body_hashed(body, 8).await, Err(BodyError::TooLarge { .. })));
        let (body, _) = Chunked::new(&chunks[..2]);
        assert_eq!(read_body_hashed(body, 8).await.unwrap().0.len(), 8);
    }

    #[tokio::test]
    async fn announced_size_refused_before_reading() {
        let err = read_body_hashed(Full::new(Bytes::from_static(b"123456789")), 8).await.unwrap_err();
        assert!(matches!(err, BodyError::TooLarge { limit: 8 }));
        assert_eq!(&read_body_hashed(Full::new(Bytes::from_static(b"12345678")), 8).await.unwrap().0[..], b"12345678");
    }

    #[tokio::test]
    async fn empty_body() {
        let (bytes, digest) = read_body_hashed(Empty::<Bytes>::new(), 0).await.unwrap();
        assert!(bytes.is_empty());
        assert_eq!(hex::encode(digest), EMPTY_SHA256);
        let (body, _) = Chunked::new(&[]);
        assert_eq!(hex::encode(read_body_hashed(body, 0).await.unwrap().1), EMPTY_SHA256);
    }

    #[tokio::test]
    async fn read_errors_and_trailers() {
        let (mut body, _) = Chunked::new(&[b"abc"]);
        body.frames.push_back(Err(std::io::Error::other("reset")));
        assert!(matches!(read_body_hashed(body, 100).await, Err(BodyError::Read(_))));

        let (mut body, _) = Chunked::new(&[b"abc"]);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-t", http::HeaderValue::from_static("v"));
        body.frames.push_back(Ok(Frame::trailers(trailers)));
        assert_eq!(&read_body_hashed(body, 3).await.unwrap().0[..], b"abc");
    }
}

mod secrets {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    use crate::signature::{SecretError, secrets::load_secret};

    fn temp_file(contents: &[u8]) -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "limiter-secret-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn load_file(contents: &[u8]) -> Result<Vec<u8>, SecretError> {
        let path = temp_file(contents);
        let result = load_secret(&format!("file:{}", path.display()));
        std::fs::remove_file(path).unwrap();
        result
    }

    #[test]
    fn file_trims_one_line_ending() {
        assert_eq!(load_file(b"s3cret\n").unwrap(), b"s3cret");
        assert_eq!(load_file(b"s3cret\r\n").unwrap(), b"s3cret");
        assert_eq!(load_file(b"s3cret").unwrap(), b"s3cret");
        assert_eq!(load_file(b"s3cret\n\n").unwrap(), b"s3cret\n");
        assert_eq!(load_file(b" s 3\xff").unwrap(), b" s 3\xff");
    }

    #[test]
    fn empty_and_missing_name_the_reference() {
        assert!(matches!(load_file(b""), Err(SecretError::Empty { .. })));
        assert!(matches!(load_file(b"\n"), Err(SecretError::Empty { .. })));
        let missing = "file:/nonexistent/limiter/key";
        let err = load_secret(missing).unwrap_err();
        assert!(matches!(err, SecretError::Read { .. }));
        assert!(err.to_string().contains(missing), "{err}");
        let unset = "env:LIMITER_TEST_SECRET_THAT_IS_NEVER_SET";
        let err = load_secret(unset).unwrap_err();
        assert!(matches!(err, SecretError::EnvMissing { .. }));
        assert!(err.to_string().contains(unset));
        assert!(matches!(load_secret("file:"), Err(SecretError::Empty { .. })));
        assert!(matches!(load_secret("env:"), Err(SecretError::Empty { .. })));
        // A directory is unreadable as a file.
        assert!(matches!(load_secret("file:/"), Err(SecretError::Read { .. })));
    }

    #[test]
    fn env_reference() {
        // PATH is always set for cargo test; setting a variable would race other tests.
        let expected = std::env::var_os("PATH").unwrap();
        assert_eq!(load_secret("env:PATH").unwrap(), expected.into_encoded_bytes());
    }

    #[test]
    fn literal_refused_without_echo() {
        for literal in ["hunter2", "FILE:/x", "envy:X", ""] {
            let err = load_secret(literal).unwrap_err();
            assert!(matches!(err, SecretError::NotAReference));
            let msg = err.to_string();
            assert!(msg.contains("references"), "{msg}");
            assert!(literal.is_empty() || !msg.contains(literal), "{msg}");
        }
    }

    #[test]
    fn a_file_over_the_bound_is_refused() {
        let bound = usize::try_from(crate::signature::secrets::MAX_SECRET_BYTES).unwrap();
        assert_eq!(load_file(&vec![b'k'; bound]).unwrap().len(), bound);
        let err = load_file(&vec![b'k'; bound + 1]).unwrap_err();
        assert!(matches!(err, SecretError::Read { .. }) && err.to_string().contains("larger than 4096"), "{err}");
    }

    #[test]
    fn readable_and_short_secret_files_are_warned_about() {
        use std::os::unix::fs::PermissionsExt as _;

        use crate::{config::Config, signature::KeySecrets};

        let set_mode = |path: &PathBuf, mode| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
        let good = temp_file(b"0123456789abcdef\n");
        set_mode(&good, 0o600).unwrap();
        let shared = temp_file(b"0123456789abcdef0123");
        set_mode(&shared, 0o640).unwrap();
        let short = temp_file(b"0123456789abcde\n");
        set_mode(&short, 0o400).unwrap();
        let text = format!(
            "[proxy]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:3000\"\n\
             [proxy.plans.p]\nlimit = 1\nwindow = \"1s\"\n\
             [[proxy.keys]]\nid = \"a\"\nplan = \"p\"\nsecrets = [\"file:{}\", \"file:{}\"]\n\
             [[proxy.keys]]\nid = \"b\"\nplan = \"p\"\nsecrets = [\"file:{}\"]\n",
            good.display(),
            shared.display(),
            short.display()
        );
        let config = Config::parse(&text, std::path::Path::new("test.toml")).unwrap();
        let secrets = KeySecrets::load(&config.proxy.unwrap()).unwrap();
        let warnings = secrets.warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].starts_with("proxy.keys[0].secrets: file:") && warnings[0].contains("mode 640"),
            "{warnings:?}"
        );
        assert!(warnings[0].contains(&shared.display().to_string()), "{warnings:?}");
        assert!(
            warnings[1].starts_with("proxy.keys[1].secrets: file:") && warnings[1].contains("is 15 bytes"),
            "{warnings:?}"
        );
        assert!(!warnings.iter().any(|w| w.contains("0123456789")), "a warning showed a secret: {warnings:?}");
        for path in [good, shared, short] {
            std::fs::remove_file(path).unwrap();
        }
    }
}
