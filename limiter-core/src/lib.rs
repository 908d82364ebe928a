//! The limiter's decisions, without I/O: what a limit is ([`spec`]; its calendar
//! windows, [`calendar`]), how an adaptive
//! concurrency limit moves ([`adaptive`]), the five
//! algorithms and the bucket store ([`limits`]), the time they are measured with
//! ([`clock`]), the signed-request scheme ([`signature`]), the checks of a client's
//! JSON Web Token ([`jwt`]), the one canonical form
//! of a request path ([`path`]), and the PROXY protocol header a balancer sends
//! ([`proxy_protocol`]), the values a rule's key reads from a request's body,
//! query and cookies ([`carried`]), and the descriptors a process was started with
//! ([`inherited`]: socket activation and `limiter upgrade`), and the JA4
//! fingerprint of a TLS ClientHello ([`ja4`]).
//!
//! Nothing here reads a file, a socket or a BPF map: the agent parses the config
//! into these types, and keeps the state that lives elsewhere (Redis, the kernel).

pub mod adaptive;
pub mod calendar;
pub mod carried;
pub mod clock;
pub mod inherited;
pub mod ja4;
pub mod jwt;
pub mod limits;
pub mod path;
pub mod proxy_protocol;
pub mod signature;
pub mod spec;

pub use self::{
    clock::{Clock, FakeClock, SystemClock},
    spec::{Algorithm, Cost, CostFrom, CostSource, LimitSpec, SpecError, Step, Throttle},
};
